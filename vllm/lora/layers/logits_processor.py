"""LoRA on the LM head (upstream: vllm/lora/layers/logits_processor.py).

LogitsProcessorWithLoRA wraps the model's LogitsProcessor; it is handed the
LM head (ParallelLMHead) at every call, as the base one. An adapter of
`lm_head` (peft: A [r, hidden], B [vocab, r]) adds `h @ A.T @ B.T` to the
raw logits, before the soft-cap and scale:
  lora_a_stacked: [max_loras, 1, max_lora_rank, hidden_size]
  lora_b_stacked: [max_loras, 1, vocab, max_lora_rank]
whole on every rank (the delta is added after the logits are gathered).

Which slot each row of hidden_states uses: when there is one row per token
of the step (prompt logprobs, or a step of one token per request) the
per-token slots; otherwise the sampled rows' slots (`sampler_indices`, one
per logits row the runner asks for). Any other row count is an internal
error of the caller.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from vllm.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)
from vllm.lora.layers.base import BaseLayerWithLoRA, LoRATensors
from vllm.lora.layers.utils import _resolve_lora_dtype
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

# Upstream's limit for the LoRA logits kernels.
_MAX_LORA_VOCAB = 258048


class LogitsProcessorWithLoRA(BaseLayerWithLoRA):
    """`sharded_to_full_mapping` (upstream: the TP reindexing of an added
    vocabulary) must be None: adapter vocabularies are not supported."""

    base_layer: LogitsProcessor

    def __init__(
        self,
        base_layer: LogitsProcessor,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
        sharded_to_full_mapping: list[int] | None,
    ) -> None:
        super().__init__()
        if sharded_to_full_mapping is not None:
            raise ValueError("LoRA extra vocabulary (sharded_to_full_mapping) is not supported.")
        self.base_layer = base_layer
        self.hidden_size = hidden_size
        self.dtype = dtype
        self.device = device
        self.tp_size = get_tensor_model_parallel_world_size()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.sharded_to_full_mapping = sharded_to_full_mapping

    @property
    def logits_as_input(self) -> bool:
        return self.base_layer.logits_as_input

    @property
    def vocab_size(self) -> int:
        return self.base_layer.vocab_size

    @property
    def org_vocab_size(self) -> int:
        return self.base_layer.org_vocab_size

    @property
    def scale(self) -> float:
        return self.base_layer.scale

    @property
    def soft_cap(self) -> float | None:
        return self.base_layer.soft_cap

    def create_lora_weights(
        self,
        max_loras: int,
        lora_config: Any,
        model_config: Any = None,
    ) -> None:
        if self.base_layer.vocab_size > _MAX_LORA_VOCAB:
            raise ValueError(f"When using LoRA, vocab size must be <= {_MAX_LORA_VOCAB}")
        # "auto": the head's dtype (the processor itself has no parameters).
        auto = lora_config.lora_dtype in (None, "auto")
        dtype = self.dtype if auto else _resolve_lora_dtype(lora_config, self.base_layer)
        rank = lora_config.max_lora_rank
        # B's rows are the logits' columns (the processor drops vocab padding).
        self.lora_a_stacked = torch.zeros(
            (max_loras, 1, rank, self.hidden_size), dtype=dtype, device=self.device
        )
        self.lora_b_stacked = torch.zeros(
            (max_loras, 1, self.base_layer.org_vocab_size, rank), dtype=dtype, device=self.device
        )

    def reset_lora(self, index: int) -> None:
        self.lora_a_stacked[index] = 0
        self.lora_b_stacked[index] = 0

    def set_lora(self, index: int, lora_a: LoRATensors, lora_b: LoRATensors) -> None:
        """lora_a: [r, hidden_size]; lora_b: [vocab, r] (scaling folded in)."""
        assert isinstance(lora_a, torch.Tensor) and isinstance(lora_b, torch.Tensor)
        slot_a, slot_b = self.lora_a_stacked[index, 0], self.lora_b_stacked[index, 0]
        if (
            lora_a.dim() != 2
            or lora_a.shape[0] > slot_a.shape[0]
            or lora_a.shape[1] != slot_a.shape[1]
        ):
            raise ValueError(
                f"{type(self).__name__}: lora_a of shape {tuple(lora_a.shape)} does not fit "
                f"the LoRA slot {tuple(slot_a.shape)}."
            )
        if (
            lora_b.dim() != 2
            or lora_b.shape[0] != slot_b.shape[0]
            or lora_b.shape[1] > slot_b.shape[1]
        ):
            raise ValueError(
                f"{type(self).__name__}: lora_b of shape {tuple(lora_b.shape)} does not fit "
                f"the LoRA slot {tuple(slot_b.shape)}."
            )
        self.reset_lora(index)
        slot_a[: lora_a.shape[0]].copy_(lora_a)
        slot_b[:, : lora_b.shape[1]].copy_(lora_b)

    def _get_logits(
        self,
        lm_head: VocabParallelEmbedding,
        hidden_states: torch.Tensor,
        embedding_bias: torch.Tensor | None,
    ) -> torch.Tensor:
        """The base head's raw logits plus each row's LM-head LoRA delta."""
        head = getattr(lm_head, "base_layer", lm_head)
        logits = self.base_layer._get_logits(head, hidden_states, embedding_bias)
        if not logits.is_contiguous():  # the TP path's padding-trimmed view
            logits = logits.contiguous()
        rows = hidden_states.shape[0]
        punica = self.punica_wrapper
        if rows == punica.token_lora_indices.numel():
            # One row per token of the step: each token's own slot.
            out = punica.add_lora_linear(
                logits,
                hidden_states,
                (self.lora_a_stacked,),
                (self.lora_b_stacked,),
                1.0,
                (logits.shape[-1],),
            )
        else:
            assert rows == punica.sampler_indices.numel(), (
                f"LoRA logits: {rows} hidden-state rows, but the step has "
                f"{punica.token_lora_indices.numel()} tokens and "
                f"{punica.sampler_indices.numel()} sampled rows"
            )
            out = punica.add_lora_logits(
                logits, hidden_states, self.lora_a_stacked, self.lora_b_stacked, 1.0
            )
        return logits if out is None else out

    def forward(
        self,
        lm_head: VocabParallelEmbedding,
        hidden_states: torch.Tensor,
        embedding_bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The base processor's forward run on this wrapper, so its
        `_get_logits` (with the LoRA delta) feeds the same soft-cap / scale."""
        forward = type(self.base_layer).forward
        return forward(cast(LogitsProcessor, self), lm_head, hidden_states, embedding_bias)

    @classmethod
    def can_replace_layer(
        cls,
        source_layer: nn.Module,
        lora_config: Any,
        packed_modules_list: list[str],
        model_config: Any = None,
    ) -> bool:
        # Built by from_layer_logits_processor, never by from_layer.
        return False
