"""The LoRA adapters of one model replica (upstream: vllm/lora/model_manager.py).

`LoRAModelManager` replaces every module of the model that LoRA can adapt
(linear layers, the input embedding, the LM head through the logits
processor) by its LoRA layer (`from_layer`), each holding `max_loras` slots
of stacked A/B weights, and owns the Punica wrapper they share.

Two caches of adapter ids:
- registered (`max_cpu_loras` entries): loaded `LoRAModel`s kept in CPU
  memory, packed modules merged (q/k/v -> qkv_proj) and scaling folded into B;
- active (`max_loras` entries): adapters copied into a slot. Slot i holds
  adapter `lora_index_to_id[i]` (None: free); the per-step `LoRAMapping`
  (adapter id per token) is turned into slots from that list.
`LRUCacheLoRAModelManager` evicts the least recently used adapter from
either cache when full, never a pinned one and never one the current step
uses (`set_adapters_in_use`).

Not built (refused, or simply not adapted): multimodal towers / connectors
(a model with `get_mm_mapping` is refused) and MoE experts (FusedMoE is not
a LoRA target; an adapter that targets experts is refused on load, naming
the modules). Pooling models take LoRA on their body (the pooler and a
classifier's `score` are no LoRA target); an adapter trained on the bare
body (names without `model.`) is accepted, as upstream.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

from vllm.config.lora import LoRAConfig
from vllm.logger import init_logger
from vllm.lora.adapter_shapes import check_adapter_fits, in_model, layer_lora_dims
from vllm.lora.layers import BaseLayerWithLoRA, LoRAMapping
from vllm.lora.lora_model import LoRAModel
from vllm.lora.lora_weights import LoRALayerWeights, PackedLoRALayerWeights
from vllm.lora.punica_wrapper import PunicaWrapperBase, get_punica_wrapper
from vllm.lora.utils import (
    from_layer,
    from_layer_logits_processor,
    get_supported_lora_modules,
    is_in_target_modules,
    is_supported_lora_module,
    replace_submodule,
)
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.models.interfaces import supports_lora
from vllm.model_executor.models.utils import PPMissingLayer
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
        # Packed module full name -> its parts' full names (qkv_proj -> q/k/v_proj).
        self.packed_modules: dict[str, list[str]] = {}
        self.modules: dict[str, BaseLayerWithLoRA] = {}
        self._last_mapping: LoRAMapping | None = None
        self._last_slot_layout: tuple[int | None, ...] | None = None
        self.packed_modules_mapping: dict[str, list[str]] = {
            k: list(v) for k, v in getattr(model, "packed_modules_mapping", {}).items()
        }
        # Upstream's multimodal / MoE state, fixed here to what is built.
        self.supports_mm = False
        self.supports_tower_connector_lora = False
        self.moe_ep_load_spec = None
        self.punica_wrapper_mapping: dict[str, PunicaWrapperBase] = {
            DEFAULT_LANGUAGE_WRAPPER_KEY: get_punica_wrapper(
                max_num_batched_tokens,
                max_batches=self.max_num_seqs,
                device=self.device,
                lora_config=self.lora_config,
            )
        }
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
        for module_name, module in self.modules.items():
            module_lora = lora_model.get_lora(module_name)
            if module_lora is None:
                module.reset_lora(index)
                continue
            assert module_lora.lora_a is not None and module_lora.lora_b is not None
            module.set_lora(index, module_lora.lora_a, module_lora.lora_b)
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

    # ----- model surgery ---------------------------------------------------

    def _match_target_modules(self, module_name: str) -> bool:
        """A module LoRA can adapt, and not left out by LoRAConfig.target_modules."""
        if not is_supported_lora_module(module_name, self.supported_lora_modules):
            return False
        return is_in_target_modules(
            module_name, self.lora_config.target_modules, self.packed_modules_mapping
        )

    def _create_lora_modules(self) -> None:
        """Swap each matched module for its LoRA layer (a tied or shared module
        is wrapped once); the LM head is adapted through the logits processor."""
        wrapped_by_id: dict[int, BaseLayerWithLoRA] = {}
        model_config = getattr(self.model, "config", None)
        for module_name, module in list(self.model.named_modules(remove_duplicate=False)):
            if isinstance(module, PPMissingLayer) or not self._match_target_modules(module_name):
                continue
            existing = wrapped_by_id.get(id(module))
            if existing is not None and "lm_head" not in module_name:
                replace_submodule(self.model, module_name, existing)
                continue
            packed = self.packed_modules_mapping.get(module_name.split(".")[-1], [])
            new_module = replace_submodule(
                self.model,
                module_name,
                from_layer(module, self.lora_slots, self.lora_config, packed, model_config),
            )
            if isinstance(new_module, BaseLayerWithLoRA):
                wrapped_by_id[id(module)] = new_module
            if "lm_head" in module_name:
                new_module = self._wrap_logits_processor(module_name, module, model_config)
            if not isinstance(new_module, BaseLayerWithLoRA):
                message = (
                    f"LoRA target module {module_name} ({type(module).__name__}) matched the "
                    "deployment configuration but could not be wrapped by any LoRA layer "
                    "implementation."
                )
                if self.lora_config.target_modules is not None:
                    raise ValueError(
                        f"{message} target_modules={sorted(self.lora_config.target_modules)}"
                    )
                logger.warning_once("%s It will be ignored.", message)
                continue
            self.modules[module_name] = new_module
            self._register_packed_modules(module_name)
            new_module.set_mapping(self.punica_wrapper)

    def _wrap_logits_processor(
        self, lm_head_name: str, lm_head: nn.Module, model_config: Any
    ) -> nn.Module:
        """The LM head's LoRA lives in the logits processor next to it (the
        head's weight is read there, not through a forward)."""
        parent = lm_head_name.rpartition(".")[0]
        lp_name = f"{parent}.logits_processor" if parent else "logits_processor"
        logits_processor = self.model.get_submodule(lp_name)
        if not isinstance(lm_head, ParallelLMHead) or not isinstance(
            logits_processor, LogitsProcessor
        ):
            return lm_head  # e.g. a quantized tied head: not adapted (warned by the caller)
        return replace_submodule(
            self.model,
            lp_name,
            from_layer_logits_processor(
                logits_processor, lm_head, self.lora_slots, self.lora_config, model_config
            ),
        )

    def _register_packed_modules(self, module_full_name: str) -> None:
        prefix, _, module_name = module_full_name.rpartition(".")
        replacements = self.packed_modules_mapping.get(module_name, [])
        if len(replacements) <= 1:
            return
        self.packed_modules[module_full_name] = [
            f"{prefix}.{r}" if prefix else r for r in replacements
        ]

    def _adapted_base_layers(self) -> dict[str, nn.Module]:
        """Adapted module name -> the layer whose shapes its LoRA must have."""
        layers: dict[str, nn.Module] = {}
        for name, module in self.modules.items():
            # The LM head's LoRA lives in the logits processor registered under
            # the head's name; the head itself stays in the model, unwrapped.
            is_head = name.rpartition(".")[2] == "lm_head"
            layers[name] = self.model.get_submodule(name) if is_head else module.base_layer
        return layers

    def _add_body_prefix(self, lora_model: LoRAModel) -> None:
        """Upstream's pooling-model rule: an adapter trained on the bare body
        (AutoModel: `layers.0.self_attn.q_proj`) names modules without the
        `model.` prefix they have here; such names are prefixed."""
        if not self.is_pooling_model:
            return
        names = {n for n, _ in self.model.named_modules(remove_duplicate=False)}
        mapping = self.packed_modules_mapping
        for name in list(lora_model.loras):
            if not in_model(name, names, mapping) and in_model(f"model.{name}", names, mapping):
                lora = lora_model.loras.pop(name)
                lora.module_name = f"model.{name}"
                lora_model.loras[lora.module_name] = lora

    def _create_merged_loras_inplace(self, lora_model: LoRAModel) -> None:
        """Pack the parts of each packed module (q/k/v_proj -> qkv_proj, None
        for a part the adapter leaves out) and fold every scaling into B."""
        self._add_body_prefix(lora_model)
        for module_name, part_names in self.packed_modules.items():
            parts: list[LoRALayerWeights | None] = [lora_model.get_lora(n) for n in part_names]
            if all(p is None for p in parts):
                continue
            lora_model.loras[module_name] = PackedLoRALayerWeights.pack(parts)
            for name in part_names:
                lora_model.loras.pop(name, None)
        for lora in lora_model.loras.values():
            lora.optimize()

    # ----- warm-up ---------------------------------------------------------

    def create_dummy_lora(
        self,
        lora_id: int,
        rank: int,
        embedding_modules: dict[str, str] | None = None,
    ) -> LoRAModel:
        """An all-zero adapter over every adapted module (warm-up, profiling),
        at the layers' full sizes like a real adapter."""
        model = LoRAModel(lora_id, rank, {})
        for module_name, layer in self._adapted_base_layers().items():
            dims = layer_lora_dims(layer)
            if dims is None:
                continue
            dtype = self.lora_config.lora_dtype
            assert isinstance(dtype, torch.dtype), "lora_dtype is resolved by the engine config"
            loras: list[LoRALayerWeights | None] = [
                LoRALayerWeights.create_dummy_lora_weights(
                    f"{module_name}.slice_{i}", in_dim, out_dim, rank, dtype, "cpu"
                )
                for i, (in_dim, out_dim) in enumerate(dims)
            ]
            if module_name in self.packed_modules:
                model.loras[module_name] = PackedLoRALayerWeights.pack(loras)
            else:
                lora = loras[0]
                assert lora is not None
                lora.module_name = module_name
                model.loras[module_name] = lora
        return model

    def get_dummy_lora_warmup_rank(self, default_rank: int) -> int:
        """The rank of warm-up adapters (upstream adjusts it only for fully
        sharded MoE layers, which are not built)."""
        return default_rank


class LRUCacheLoRAModelManager(LoRAModelManager):
    """A manager whose two caches evict the least recently used adapter."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Adapters the current step's tokens map to: never evicted from a slot.
        self._in_use: set[int] = set()
        # Pinned adapters without a slot now: pinned in it on activation.
        self._pending_slot_pins: set[int] = set()

    def set_adapters_in_use(self, lora_ids: set[int]) -> None:
        """Mark the adapters of the step being prepared (replaces the last set)
        and make the loaded ones the most recently used in both caches."""
        self._in_use = set(lora_ids)
        for lora_id in lora_ids:
            self._registered_adapters.touch(lora_id)
            self._active_adapters.touch(lora_id)

    def remove_all_adapters(self) -> None:
        super().remove_all_adapters()
        self._in_use = set()
        self._pending_slot_pins = set()

    def add_adapter(self, lora: LoRAModel) -> bool:
        """Register (or, when already registered, mark recently used)."""
        if lora.id in self._registered_adapters:
            self._registered_adapters.touch(lora.id)
            return False
        self.check_fits(lora)
        if len(self._registered_adapters) >= self.capacity and not self.remove_oldest_adapter():
            # Every loaded adapter is pinned or in use by this step: keep them
            # all and exceed max_cpu_loras until one can go.
            logger.warning(
                "All %d loaded LoRAs are pinned or in use; loading LoRA %d beyond max_cpu_loras.",
                len(self._registered_adapters),
                lora.id,
            )
        self._registered_adapters.insert(lora.id, lora, evict=False)
        return True

    def can_activate(self, lora_id: int) -> bool:
        """Whether `lora_id` has or can get a slot without evicting an adapter
        in use or a pinned one."""
        if lora_id in self._active_adapters or len(self._active_adapters) < self.lora_slots:
            return True
        busy = self._in_use | self._active_adapters.pinned_items
        return any(key not in busy for key in self._active_adapters.order)

    def activate_adapter(self, lora_id: int) -> bool:
        if lora_id not in self._active_adapters and len(self._active_adapters) >= self.lora_slots:
            self._evict_one_slot()
        result = super().activate_adapter(lora_id)
        self._active_adapters.touch(lora_id)
        if lora_id in self._pending_slot_pins:
            self._pending_slot_pins.discard(lora_id)
            self._active_adapters.pin(lora_id)
        return result

    def _evict_one_slot(self) -> None:
        """Free the slot of the least recently used adapter not in use, not
        pinned if possible. A pinned one is displaced only when the step needs
        its slot (it stays registered and pinned in the CPU cache)."""
        order = [k for k in self._active_adapters.order if k not in self._in_use]
        unpinned = [k for k in order if k not in self._active_adapters.pinned_items]
        if unpinned:
            self._active_adapters.pop(unpinned[0])
            return
        if not order:
            raise RuntimeError(
                f"All {self.lora_slots} LoRA slots hold adapters in use by this step."
            )
        logger.warning(
            "LoRA %d is pinned but its slot is needed by this step's adapters; "
            "it stays loaded in CPU memory and takes a slot again when next used.",
            order[0],
        )
        self._pending_slot_pins.add(order[0])
        self._active_adapters.pop(order[0])

    def remove_oldest_adapter(self) -> bool:
        """Unload the least recently used registered adapter that is neither
        pinned nor in use by the current step; False when there is none."""
        cache = self._registered_adapters
        if len(cache) == 0:
            return False
        idle = [k for k in cache.order if k not in cache.pinned_items and k not in self._in_use]
        if not idle:
            return False  # unloading one the step uses would drop it from its slot
        cache.pop(idle[0])
        return True

    def trim_to_capacity(self) -> None:
        """Unload idle adapters while more than max_cpu_loras are loaded (after
        a step that had to exceed it)."""
        while len(self._registered_adapters) > self.capacity and self.remove_oldest_adapter():
            pass

    def remove_adapter(self, adapter_id: int) -> bool:
        self._pending_slot_pins.discard(adapter_id)
        return super().remove_adapter(adapter_id)

    def pin_adapter(self, lora_id: int) -> bool:
        """Keep a registered adapter in both caches (never evicted by LRU)."""
        try:
            self._registered_adapters.pin(lora_id)
        except ValueError as err:
            raise ValueError(f"Pinning failed. LoRA {lora_id} is not registered.") from err
        if lora_id in self._active_adapters:
            self._active_adapters.pin(lora_id)
        elif self.can_activate(lora_id):
            self.activate_adapter(lora_id)
            self._active_adapters.pin(lora_id)
        else:
            # Every slot is taken by adapters in use or pinned: it gets one
            # (and is pinned there) when next activated.
            self._pending_slot_pins.add(lora_id)
        return True


def create_lora_manager(
    model: nn.Module,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    vocab_size: int,
    lora_config: LoRAConfig,
    vllm_config: Any,
    device: torch.device,
    lora_manager_cls: type[LoRAModelManager] = LoRAModelManager,
    **kwargs: Any,
) -> LoRAModelManager:
    """Build `lora_manager_cls` for `model` (which must support LoRA)."""
    if not supports_lora(model):
        raise ValueError(f"Model {type(model)} is not supported for LoRA.")
    return lora_manager_cls(
        model=model,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        vocab_size=vocab_size,
        lora_config=lora_config,
        vllm_config=vllm_config,
        device=device,
        **kwargs,
    )
