"""`LoRAModelManager`, the manager of the LoRA adapters of one model replica,
and `AdapterLRUCache` (upstream: both in vllm/lora/model_manager.py, which
re-exports them from here next to its `LRUCacheLoRAModelManager`; the
overview of slots and caches is in that module's docstring).

The module surgery (LoRA layers in place of the model's modules) is in
vllm/lora/model_surgery.py, the layout of a loaded adapter (packed modules,
scaling folded into B, warm-up adapters) in vllm/lora/adapter_packing.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

from vllm.config.lora import LoRAConfig
from vllm.logger import init_logger
from vllm.lora.adapter_packing import add_body_prefix, create_dummy_lora, merge_packed_loras
from vllm.lora.adapter_shapes import check_adapter_fits
from vllm.lora.layers import BaseLayerWithLoRA, LoRAMapping
from vllm.lora.lora_model import LoRAModel
from vllm.lora.model_surgery import adapted_base_layers, create_lora_modules, load_into_slot
from vllm.lora.punica_wrapper import PunicaWrapperBase, get_punica_wrapper
from vllm.lora.utils import get_supported_lora_modules
from vllm.utils.cache import LRUCache

logger = init_logger(__name__)

T = TypeVar("T")
DEFAULT_LANGUAGE_WRAPPER_KEY = "language_model"


class AdapterLRUCache(LRUCache[int, T]):
    """An LRU of adapter ids that calls `deactivate_fn(id)` on every removal."""

    def __init__(self, capacity: int, deactivate_fn: Callable[[int], object]) -> None:
        super().__init__(capacity)
        self.deactivate_fn = deactivate_fn

    def _on_remove(self, key: int, value: T | None) -> None:
        logger.debug("Removing adapter int id: %d", key)
        self.deactivate_fn(key)
        super()._on_remove(key, value)


class LoRAModelManager:
    """A manager of the LoRA adapters of one model (see the module docstring)."""

    def __init__(
        self,
        model: nn.Module,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        vocab_size: int,
        lora_config: LoRAConfig,
        device: torch.device,
        vllm_config: Any = None,
    ) -> None:
        if hasattr(model, "get_mm_mapping"):
            raise ValueError(f"{type(model).__name__}: LoRA on multimodal models is not built.")
        self.model = model
        self.supported_lora_modules = get_supported_lora_modules(model)
        if not self.supported_lora_modules:
            raise ValueError(f"No supported LoRA modules found in {type(model).__name__}.")
        self.adapter_type = "LoRA"
        self.lora_config = lora_config
        self.device = device
        self.max_num_seqs = max_num_seqs
        assert self.capacity >= self.lora_slots
        self._registered_adapters: AdapterLRUCache[LoRAModel] = AdapterLRUCache(
            self.capacity, self.deactivate_adapter
        )
        self._active_adapters: AdapterLRUCache[None] = AdapterLRUCache(
            self.lora_slots, self._deactivate_adapter
        )
        self.max_num_batched_tokens = math.ceil(max_num_batched_tokens / 8) * 8
        # Slot i -> the adapter id copied into it (None: free).
        self.lora_index_to_id: list[int | None] = [None] * self.lora_slots
        self.vocab_size = vocab_size
        # Pooling models take LoRA on their body (the pooler is no LoRA target).
        self.is_pooling_model = getattr(model, "pooler", None) is not None
        self._last_mapping: LoRAMapping | None = None
        self._last_slot_layout: tuple[int | None, ...] | None = None
        self.packed_modules_mapping: dict[str, list[str]] = {
            k: list(v) for k, v in getattr(model, "packed_modules_mapping", {}).items()
        }
        # Upstream's multimodal / MoE state, fixed here to what is built.
        self.supports_mm = False
        self.supports_tower_connector_lora = False
        self.moe_ep_load_spec = None
        self._init_punica_wrapper(max_num_batched_tokens)
        self._create_lora_modules()
        self.model.lora_manager = self  # type: ignore[assignment]

    def __len__(self) -> int:
        return len(self._registered_adapters)

    @property
    def capacity(self) -> int:
        assert self.lora_config.max_cpu_loras is not None
        return self.lora_config.max_cpu_loras

    @property
    def lora_slots(self) -> int:
        return self.lora_config.max_loras

    @property
    def adapter_slots(self) -> int:
        return self.lora_slots

    @property
    def punica_wrapper(self) -> PunicaWrapperBase:
        return self.punica_wrapper_mapping[DEFAULT_LANGUAGE_WRAPPER_KEY]

    def _init_punica_wrapper(self, max_num_batched_tokens: int) -> None:
        """One Punica wrapper (the language model's) shared by every layer."""
        self.punica_wrapper_mapping: dict[str, PunicaWrapperBase] = {
            DEFAULT_LANGUAGE_WRAPPER_KEY: get_punica_wrapper(
                max_num_batched_tokens,
                max_batches=self.max_num_seqs,
                device=self.device,
                lora_config=self.lora_config,
            )
        }

    # ----- slots -----------------------------------------------------------

    def activate_adapter(self, lora_id: int) -> bool:
        """Copy a registered adapter into the first free slot (False when it
        already has one); ValueError when every slot is taken."""
        if lora_id in self._active_adapters:
            return False
        free = [i for i, held in enumerate(self.lora_index_to_id) if held is None]
        if not free:
            raise ValueError("No free lora slots")
        index = free[0]
        lora_model = self._registered_adapters[lora_id]
        self._active_adapters[lora_id] = None
        logger.debug("Activating LoRA. int id: %d, slot index: %d", lora_model.id, index)
        self.lora_index_to_id[index] = lora_model.id
        load_into_slot(self.modules, index, lora_model)
        return True

    def _deactivate_adapter(self, lora_id: int) -> None:
        """Free the adapter's slot (its stale weights stay until the next
        activation overwrites them: no token maps to a free slot)."""
        if lora_id in self.lora_index_to_id:
            self.lora_index_to_id[self.lora_index_to_id.index(lora_id)] = None

    def deactivate_adapter(self, adapter_id: int) -> bool:
        if adapter_id not in self._active_adapters:
            return False
        self._active_adapters.pop(adapter_id, None)  # frees the slot via _on_remove
        return True

    def set_adapter_mapping(self, mapping: LoRAMapping) -> None:
        """Hand the step's token -> adapter mapping to the Punica wrapper
        (skipped when neither it nor the slot layout changed)."""
        slot_layout = tuple(self.lora_index_to_id)
        if self._last_mapping != mapping or self._last_slot_layout != slot_layout:
            self.punica_wrapper.update_metadata(
                mapping, self.lora_index_to_id, self.lora_slots + 1, self.vocab_size
            )
            self._last_mapping = mapping
            self._last_slot_layout = slot_layout

    # ----- registry --------------------------------------------------------

    def check_fits(self, lora: LoRAModel) -> None:
        """Merge the adapter's packed modules and refuse it (ValueError) when
        it does not fit the model (vllm/lora/adapter_shapes.py)."""
        self._create_merged_loras_inplace(lora)
        check_adapter_fits(
            lora, self._adapted_base_layers(), self.model, self.packed_modules_mapping
        )

    def _add_adapter(self, lora: LoRAModel) -> None:
        self.check_fits(lora)
        self._registered_adapters[lora.id] = lora

    def add_adapter(self, adapter: LoRAModel) -> bool:
        """Register a loaded adapter (False when its id is already there)."""
        if adapter.id in self._registered_adapters:
            return False
        if len(self._registered_adapters) >= self.capacity:
            raise RuntimeError("No free adapter slots.")
        self._add_adapter(adapter)
        return True

    def remove_adapter(self, adapter_id: int) -> bool:
        self.deactivate_adapter(adapter_id)
        if adapter_id not in self._registered_adapters:
            return False
        self._registered_adapters.pop(adapter_id, None)
        return True

    def remove_all_adapters(self) -> None:
        self._registered_adapters.clear()
        self.lora_index_to_id = [None] * self.lora_slots
        self._active_adapters.clear()
        self._last_mapping = None
        self._last_slot_layout = None

    def list_adapters(self) -> dict[int, LoRAModel]:
        return dict(self._registered_adapters.cache)

    def get_adapter(self, adapter_id: int) -> LoRAModel | None:
        return self._registered_adapters.cache.get(adapter_id)

    def pin_adapter(self, lora_id: int) -> bool:
        raise NotImplementedError(
            "Pinning is not supported in LoRAModelManager. Use LRUCacheLoRAModelManager for pinning"
        )

    # ----- model surgery (vllm/lora/model_surgery.py) ---------------------

    def _create_lora_modules(self) -> None:
        """Swap each matched module for its LoRA layer, all sharing the
        Punica wrapper; fills `modules` and `packed_modules`."""
        created = create_lora_modules(
            self.model,
            self.supported_lora_modules,
            self.lora_slots,
            self.lora_config,
            self.packed_modules_mapping,
            self.punica_wrapper,
        )
        self.modules: dict[str, BaseLayerWithLoRA] = created.modules
        # Packed module full name -> its parts' full names (qkv_proj -> q/k/v_proj).
        self.packed_modules: dict[str, list[str]] = created.packed_modules

    def _adapted_base_layers(self) -> dict[str, nn.Module]:
        return adapted_base_layers(self.model, self.modules)

    # ----- adapter layout (vllm/lora/adapter_packing.py) -------------------

    def _create_merged_loras_inplace(self, lora_model: LoRAModel) -> None:
        """Pack the parts of each packed module (q/k/v_proj -> qkv_proj) and
        fold every scaling into B; a pooling model's bare-body names are
        prefixed with `model.` first."""
        if self.is_pooling_model:
            add_body_prefix(self.model, lora_model, self.packed_modules_mapping)
        merge_packed_loras(lora_model, self.packed_modules)

    def create_dummy_lora(
        self,
        lora_id: int,
        rank: int,
        embedding_modules: dict[str, str] | None = None,
    ) -> LoRAModel:
        """An all-zero adapter over every adapted module (warm-up, profiling),
        at the layers' full sizes like a real adapter."""
        dtype = self.lora_config.lora_dtype
        assert isinstance(dtype, torch.dtype), "lora_dtype is resolved by the engine config"
        return create_dummy_lora(
            lora_id, rank, self._adapted_base_layers(), self.packed_modules, dtype
        )

    def get_dummy_lora_warmup_rank(self, default_rank: int) -> int:
        """The rank of warm-up adapters (upstream adjusts it only for fully
        sharded MoE layers, which are not built)."""
        return default_rank
