"""LoRA on the input embedding (upstream:
vllm/lora/layers/vocal_parallel_embedding.py, upstream's file name kept).

peft's embedding LoRA is `lora_embedding_A` [r, vocab] and
`lora_embedding_B` [hidden, r]: token id v gets `A[:, v] @ B.T` added (the
scaling folded into B). So A is stored transposed, one row per token id:
  lora_a_stacked: [max_loras, org_vocab_size, max_lora_rank]
  lora_b_stacked: [max_loras, 1, embedding_dim, max_lora_rank]
and the forward looks up row `slot * org_vocab_size + id` of the flattened
A (the adapter's A column for that token), then expands it with the slot's B.
Both are whole on every rank: the delta is added after the base layer's
tensor-parallel all-reduce. Adapters that add tokens (extra vocabulary) are
not supported, as in upstream v0.28.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vllm.lora.layers.base import BaseLayerWithLoRA, LoRATensors
from vllm.lora.layers.utils import _get_lora_device, _resolve_lora_dtype
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)


class VocabParallelEmbeddingWithLoRA(BaseLayerWithLoRA):
    base_layer: VocabParallelEmbedding

    def __init__(self, base_layer: VocabParallelEmbedding) -> None:
        super().__init__()
        self.base_layer = base_layer

    def create_lora_weights(
        self,
        max_loras: int,
        lora_config: Any,
        model_config: Any = None,
    ) -> None:
        base = self.base_layer
        dtype = _resolve_lora_dtype(lora_config, base)
        device = _get_lora_device(base)
        rank = lora_config.max_lora_rank
        self.lora_a_stacked = torch.zeros(
            (max_loras, base.org_vocab_size, rank), dtype=dtype, device=device
        )
        self.lora_b_stacked = torch.zeros(
            (max_loras, 1, base.embedding_dim, rank), dtype=dtype, device=device
        )
        # [max_loras * org_vocab_size, rank]: one lookup table over all slots.
        self.lora_a_stacked_2d = self.lora_a_stacked.view(-1, rank)

    def reset_lora(self, index: int) -> None:
        self.lora_a_stacked[index] = 0
        self.lora_b_stacked[index] = 0

    def set_lora(self, index: int, lora_a: LoRATensors, lora_b: LoRATensors) -> None:
        """lora_a: peft's [r, vocab]; lora_b: [embedding_dim, r]."""
        assert isinstance(lora_a, torch.Tensor) and isinstance(lora_b, torch.Tensor)
        vocab, dim = self.lora_a_stacked.shape[1], self.lora_b_stacked.shape[2]
        rank = self.lora_a_stacked.shape[2]
        if lora_a.dim() != 2 or lora_a.shape[1] != vocab or lora_a.shape[0] > rank:
            raise ValueError(
                f"{type(self).__name__}: lora_a of shape {tuple(lora_a.shape)} does not fit "
                f"[rank <= {rank}, vocab {vocab}]."
            )
        if lora_b.dim() != 2 or lora_b.shape != (dim, lora_a.shape[0]):
            raise ValueError(
                f"{type(self).__name__}: lora_b of shape {tuple(lora_b.shape)} does not fit "
                f"[embedding_dim {dim}, rank {lora_a.shape[0]}]."
            )
        self.reset_lora(index)
        r = lora_a.shape[0]
        self.lora_a_stacked[index, :, :r].copy_(lora_a.T)
        self.lora_b_stacked[index, 0, :, :r].copy_(lora_b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T] token ids -> [T, embedding_dim], as the base layer."""
        output = self.base_layer(x)
        shape = output.shape
        ids = x.reshape(-1)
        # Base tokens (slot -1) look up slot 0's row; the expand skips them.
        slots = self.punica_wrapper.token_lora_indices[: ids.numel()].clamp(min=0)
        rows = F.embedding(ids + slots * self.lora_a_stacked.shape[1], self.lora_a_stacked_2d)
        output = output.reshape(-1, shape[-1])
        out = self.punica_wrapper.add_lora_embedding(output, rows, self.lora_b_stacked)
        if out is not None:
            output = out
        return output.reshape(shape)

    @classmethod
    def can_replace_layer(
        cls,
        source_layer: nn.Module,
        lora_config: Any,
        packed_modules_list: list[str],
        model_config: Any = None,
    ) -> bool:
        return isinstance(source_layer, VocabParallelEmbedding) and not isinstance(
            source_layer, ParallelLMHead
        )

    @property
    def weight(self) -> torch.Tensor:
        return self.base_layer.weight
