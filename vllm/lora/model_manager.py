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

`LoRAModelManager` and `AdapterLRUCache` live in model_manager_base.py and
are re-exported here (upstream's import path), with
`DEFAULT_LANGUAGE_WRAPPER_KEY`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vllm.config.lora import LoRAConfig
from vllm.logger import init_logger
from vllm.lora.lora_model import LoRAModel
from vllm.lora.model_manager_base import (
    DEFAULT_LANGUAGE_WRAPPER_KEY,
    AdapterLRUCache,
    LoRAModelManager,
)
from vllm.model_executor.models.interfaces import supports_lora

logger = init_logger(__name__)

__all__ = [
    "DEFAULT_LANGUAGE_WRAPPER_KEY",
    "AdapterLRUCache",
    "LRUCacheLoRAModelManager",
    "LoRAModelManager",
    "create_lora_manager",
]


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
