"""The interface every LoRA-aware layer implements (upstream:
vllm/lora/layers/base.py).

A LoRA layer wraps a model layer (`base_layer`) and holds `max_loras` slots
of adapter weights, stacked so one batched op serves every adapter of a
step: slot i of `lora_a_stacked[s]` / `lora_b_stacked[s]` is the adapter the
model manager loaded into slot i (zero when free), s the output slice of a
packed layer. The Punica wrapper given by `set_mapping` tells the forward
which slot each token uses (-1: none).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from vllm.config.lora import LoRAConfig
    from vllm.lora.punica_wrapper import PunicaWrapperBase

# A LoRA A or B as handed to set_lora: one tensor, or one per slice of a
# packed layer (None: the adapter does not target that slice).
LoRATensors = torch.Tensor | list[torch.Tensor | None]


class BaseLayerWithLoRA(nn.Module):
    """A model layer plus stacked LoRA slots; forward returns exactly what
    `base_layer` returns, with each token's adapter delta added."""

    base_layer: nn.Module
    punica_wrapper: PunicaWrapperBase

    def slice_lora_a(self, lora_a: Any) -> Any:
        """This tensor-parallel rank's part of an adapter's A (identity
        unless the layer shards A)."""
        return lora_a

    def slice_lora_b(self, lora_b: Any) -> Any:
        """This tensor-parallel rank's part of an adapter's B (identity
        unless the layer shards B)."""
        return lora_b

    def create_lora_weights(
        self,
        max_loras: int,
        lora_config: LoRAConfig,
        model_config: Any = None,
    ) -> None:
        """Allocate the zeroed `[max_loras, ...]` stacked slots."""
        raise NotImplementedError

    def reset_lora(self, index: int) -> None:
        """Zero slot `index` (its adapter then adds nothing)."""
        raise NotImplementedError

    def set_lora(self, index: int, lora_a: LoRATensors, lora_b: LoRATensors) -> None:
        """Copy one adapter's A [rank, in] / B [out, rank] (scaling already
        folded into B) into slot `index`, zero-padded to max_lora_rank."""
        raise NotImplementedError

    def set_mapping(self, punica_wrapper: PunicaWrapperBase) -> None:
        """The wrapper holding the per-step token -> slot metadata."""
        self.punica_wrapper = punica_wrapper

    @classmethod
    def can_replace_layer(
        cls,
        source_layer: nn.Module,
        lora_config: LoRAConfig,
        packed_modules_list: list[str],
        model_config: Any = None,
    ) -> bool:
        """Whether this class wraps `source_layer` (`packed_modules_list`:
        the checkpoint modules packed into it, e.g. [q_proj, k_proj, v_proj])."""
        raise NotImplementedError
