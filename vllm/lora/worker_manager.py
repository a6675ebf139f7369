"""LoRA adapters on a worker (upstream: vllm/lora/worker_manager.py).

The model runner calls `set_active_adapters(requests, mapping)` once per
step with the step's adapters; the manager loads any it does not have (a
peft directory read on CPU, checked against the model and `LoRAConfig`),
gives each a slot and hands the token mapping to the model manager.

`WorkerLoRAManager` keeps exactly the step's adapters (others removed);
`LRUCacheWorkerLoRAManager` keeps up to `max_cpu_loras` loaded and
`max_loras` in slots, evicting the least recently used, never one the step
uses and never a pinned one.

Loading errors: a missing directory or `adapter_config.json` is
`LoRAAdapterNotFoundError` (a 404 on the server); everything else wrong with
an adapter (rank above `max_lora_rank`, DoRA, bias, `modules_to_save`,
target modules the model cannot adapt, no tensors, shapes of another base
model) is a ValueError naming the problem. A failed load changes nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch
from torch import nn

from vllm.config.lora import LoRAConfig
from vllm.exceptions import LoRAAdapterNotFoundError
from vllm.logger import init_logger
from vllm.lora.layers import LoRAMapping
from vllm.lora.lora_model import LoRAModel
from vllm.lora.model_manager import (
    LoRAModelManager,
    LRUCacheLoRAModelManager,
    create_lora_manager,
)
from vllm.lora.peft_helper import PEFTHelper
from vllm.lora.request import LoRARequest
from vllm.lora.utils import get_adapter_absolute_path

logger = init_logger(__name__)


class WorkerLoRAManager:
    """Loads the step's adapters and unloads every other one."""

    _manager_cls: type[LoRAModelManager] = LoRAModelManager

    def __init__(
        self,
        vllm_config: Any,
        device: torch.device,
        embedding_modules: dict[str, str],
        lora_model_cls: type[LoRAModel] = LoRAModel,
    ) -> None:
        self._lora_model_cls = lora_model_cls
        self.embedding_modules = embedding_modules
        self._cached_dummy_lora: None | Literal[False] | LoRAModel = False
        self.max_num_seqs = vllm_config.scheduler_config.max_num_seqs
        self.max_num_batched_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.vocab_size = vllm_config.model_config.get_vocab_size()
        lora_config = getattr(vllm_config, "lora_config", None)
        if lora_config is None:
            raise ValueError("LoRA config must be set for WorkerLoRAManager.")
        self.lora_config: LoRAConfig = lora_config
        text_config = vllm_config.model_config.hf_text_config
        self.max_position_embeddings: int | None = getattr(
            text_config, "max_position_embeddings", None
        )
        self.device = device
        # Set by create_lora_manager.
        self._adapter_manager: LoRAModelManager

    @contextmanager
    def dummy_lora_cache(self) -> Iterator[None]:
        """Reuse one dummy adapter for all warm-up adapters inside the block."""
        self._cached_dummy_lora = None
        yield
        self._cached_dummy_lora = False

    @property
    def is_enabled(self) -> bool:
        return True

    def create_lora_manager(self, model: nn.Module, vllm_config: Any = None) -> nn.Module:
        """Wrap the model's LoRA-able layers; returns the (same, modified) model."""
        if vllm_config is None:
            raise ValueError("vllm_config must be provided to create a LoRA manager.")
        self._adapter_manager = create_lora_manager(
            model,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            vocab_size=self.vocab_size,
            lora_config=self.lora_config,
            device=self.device,
            lora_manager_cls=self._manager_cls,
            vllm_config=vllm_config,
        )
        return self._adapter_manager.model

    def _expected_lora_modules(self) -> set[str]:
        """Module-name suffixes an adapter may target: the supported ones with
        packed modules replaced by their parts (qkv_proj -> q/k/v_proj)."""
        packed = self._adapter_manager.packed_modules_mapping
        expected: set[str] = set()
        for module in self._adapter_manager.supported_lora_modules:
            expected.update(packed.get(module, [module]))
        return expected

    def _check_no_added_vocabulary(self, lora_request: LoRARequest, lora_path: str) -> None:
        """Refuse an adapter that extends the vocabulary: upstream v0.28 has no
        LoRA extra vocabulary, and its tokens would have no embedding here."""
        for legacy in ("new_embeddings.safetensors", "new_embeddings.bin"):
            if os.path.isfile(os.path.join(lora_path, legacy)):
                raise ValueError(
                    f"LoRA adapter {lora_request.lora_name} adds tokens to the vocabulary "
                    f"({legacy}): adapters with extra vocabulary are not supported."
                )
        added_path = os.path.join(lora_path, "added_tokens.json")
        if not os.path.isfile(added_path):
            return
        with open(added_path) as f:
            added = json.load(f)
        extra = sorted(
            name
            for name, token_id in (added.items() if isinstance(added, dict) else [])
            if not isinstance(token_id, int) or token_id >= self.vocab_size
        )
        if extra:
            raise ValueError(
                f"LoRA adapter {lora_request.lora_name} adds tokens to the vocabulary "
                f"(added_tokens.json: {extra[:5]} beyond the model's {self.vocab_size}): "
                "adapters with extra vocabulary are not supported."
            )

    def _load_adapter(self, lora_request: LoRARequest) -> LoRAModel:
        """Read and check the adapter on CPU (see the module docstring)."""
        if lora_request.is_3d_lora_weight:
            raise ValueError(
                f"LoRA adapter {lora_request.lora_name}: is_3d_lora_weight (MoE expert "
                "weights) is not supported: MoE LoRA is not built."
            )
        lora_path = get_adapter_absolute_path(lora_request.lora_path)
        try:
            peft_helper = PEFTHelper.from_local_dir(
                lora_path, self.max_position_embeddings, lora_request.tensorizer_config_dict
            )
        except (FileNotFoundError, NotADirectoryError) as e:
            # No directory, or no adapter_config.json in it (upstream: 404).
            raise LoRAAdapterNotFoundError(lora_request.lora_name, lora_request.lora_path) from e
        except json.JSONDecodeError as e:
            raise ValueError(
                f"LoRA adapter {lora_request.lora_name}: {lora_path}/adapter_config.json "
                f"is not valid JSON ({e})."
            ) from e
        # Refuse what this engine cannot serve before reading any tensor.
        peft_helper.validate_legal(self.lora_config)
        self._check_no_added_vocabulary(lora_request, lora_path)
        model = self._adapter_manager.model
        hf_to_vllm_mapper = getattr(model, "hf_to_vllm_mapper", None)
        if hf_to_vllm_mapper is not None and hasattr(hf_to_vllm_mapper, "get_unstacked_mapper"):
            hf_to_vllm_mapper = hf_to_vllm_mapper.get_unstacked_mapper()
        try:
            lora = self._lora_model_cls.from_local_checkpoint(
                lora_path,
                self._expected_lora_modules(),
                peft_helper=peft_helper,
                lora_model_id=lora_request.lora_int_id,
                device="cpu",
                dtype=self.lora_config.lora_dtype,  # type: ignore[arg-type]
                model_vocab_size=self.vocab_size,
                tensorizer_config_dict=lora_request.tensorizer_config_dict,
                weights_mapper=hf_to_vllm_mapper,
                skip_prefixes=getattr(model, "lora_skip_prefixes", None),
            )
        except FileNotFoundError as e:
            raise LoRAAdapterNotFoundError(lora_request.lora_name, lora_request.lora_path) from e
        return lora

    def add_dummy_lora(self, lora_request: LoRARequest, rank: int) -> bool:
        """Register an all-zero adapter under the request's id (warm-up)."""
        if lora_request.lora_int_id in self.list_adapters():
            return False
        if isinstance(self._cached_dummy_lora, LoRAModel):
            dummy_lora = self._cached_dummy_lora.clone(lora_request.lora_int_id)
        else:
            dummy_lora = self._adapter_manager.create_dummy_lora(
                lora_request.lora_int_id, rank, self.embedding_modules
            )
            if self._cached_dummy_lora is None:
                self._cached_dummy_lora = dummy_lora
        return self._adapter_manager.add_adapter(dummy_lora)

    def get_dummy_lora_warmup_rank(self, default_rank: int) -> int:
        return self._adapter_manager.get_dummy_lora_warmup_rank(default_rank)

    def pin_adapter(self, adapter_id: int) -> bool:
        return self._adapter_manager.pin_adapter(adapter_id)

    def set_active_adapters(
        self, requests: Iterable[LoRARequest], mapping: LoRAMapping | None
    ) -> None:
        """Make exactly the step's adapters usable, then set the token mapping."""
        self._apply_adapters(requests)
        if mapping is not None:
            self._adapter_manager.set_adapter_mapping(mapping)

    def supports_tower_connector_lora(self) -> bool:
        return False

    def _requests_by_id(self, requests: Iterable[LoRARequest]) -> dict[int, LoRARequest]:
        by_id = {r.lora_int_id: r for r in requests if r}
        if len(by_id) > self._adapter_manager.lora_slots:
            raise RuntimeError(
                f"Number of requested LoRAs ({len(by_id)}) is greater than the number "
                f"of GPU LoRA slots ({self._adapter_manager.lora_slots})."
            )
        return by_id

    def _apply_adapters(self, adapter_requests: Iterable[LoRARequest]) -> None:
        by_id = self._requests_by_id(adapter_requests)
        existing = self.list_adapters()
        for adapter_id in existing - set(by_id):
            self.remove_adapter(adapter_id)
        for adapter_id in set(by_id) - existing:
            self.add_adapter(by_id[adapter_id])

    def add_adapter(self, adapter_request: LoRARequest) -> bool:
        """Load, register and activate (False when already loaded)."""
        if adapter_request.lora_int_id in self.list_adapters():
            return False
        loaded_adapter = self._load_adapter(adapter_request)
        loaded = self._adapter_manager.add_adapter(loaded_adapter)
        self._adapter_manager.activate_adapter(loaded_adapter.id)
        return loaded

    def remove_adapter(self, adapter_id: int) -> bool:
        return self._adapter_manager.remove_adapter(adapter_id)

    def remove_all_adapters(self) -> None:
        self._adapter_manager.remove_all_adapters()

    def list_adapters(self) -> set[int]:
        return set(self._adapter_manager.list_adapters())


class LRUCacheWorkerLoRAManager(WorkerLoRAManager):
    """Keeps adapters loaded up to the caches' capacities (LRU eviction)."""

    _manager_cls: type[LoRAModelManager] = LRUCacheLoRAModelManager

    @property
    def _lru(self) -> LRUCacheLoRAModelManager:
        assert isinstance(self._adapter_manager, LRUCacheLoRAModelManager)
        return self._adapter_manager

    def _apply_adapters(self, lora_requests: Iterable[LoRARequest]) -> None:
        """Give every adapter of the step a slot. The step's adapters that
        already have one are marked recently used first, and all of them are
        marked in use, so loading the others evicts only adapters this step
        does not use: no in-flight adapter changes slot mid-step."""
        by_id = self._requests_by_id(lora_requests)
        manager = self._lru
        manager.set_adapters_in_use(set(by_id))
        for lora_request in by_id.values():
            self.add_adapter(lora_request)
            # add_adapter leaves a new adapter without a slot when none is
            # free of other work; the step needs one, so take it here.
            manager.activate_adapter(lora_request.lora_int_id)
        manager.trim_to_capacity()

    def add_adapter(self, lora_request: LoRARequest) -> bool:
        """Load (or with `load_inplace`, reload) and register the adapter, and
        give it a slot if one can be had without evicting an adapter in use
        or pinned. The new adapter is loaded and checked before anything is
        evicted, so a failed load changes nothing. True when it was loaded."""
        manager = self._lru
        if lora_request.lora_int_id in self.list_adapters() and not lora_request.load_inplace:
            manager.add_adapter(manager.list_adapters()[lora_request.lora_int_id])  # touch
            loaded = True
        else:
            lora = self._load_adapter(lora_request)
            manager.check_fits(lora)
            manager.remove_adapter(lora.id)  # load_inplace: drop the old weights
            # Evicts down to max_cpu_loras (never a pinned or in-use adapter).
            while len(manager) + 1 > manager.capacity and manager.remove_oldest_adapter():
                pass
            loaded = manager.add_adapter(lora)
        if manager.can_activate(lora_request.lora_int_id):
            manager.activate_adapter(lora_request.lora_int_id)
        return loaded
