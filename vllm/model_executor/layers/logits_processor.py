"""Hidden states -> vocabulary logits (upstream: vllm/model_executor/layers/logits_processor.py)."""

from __future__ import annotations

import torch
from torch import nn

from vllm.distributed import get_tensor_model_parallel_world_size, tensor_model_parallel_all_gather
from vllm.model_executor.layers.utils import unquantized_gemm
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding


class LogitsProcessor(nn.Module):
    """Projects hidden states with the LM head, drops the vocabulary padding,
    then applies the optional soft-cap (cap * tanh(logits / cap)) and scale."""

    def __init__(
        self,
        vocab_size: int,
        org_vocab_size: int | None = None,
        scale: float = 1.0,
        logits_as_input: bool = False,
        soft_cap: float | None = None,
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.org_vocab_size = org_vocab_size or vocab_size
        self.scale = scale
        self.logits_as_input = logits_as_input
        self.soft_cap = soft_cap

    def forward(
        self,
        lm_head: VocabParallelEmbedding,
        hidden_states: torch.Tensor,
        embedding_bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """hidden_states [T, hidden] (or logits when `logits_as_input`) ->
        logits [T, org_vocab_size] in the model dtype."""
        if self.logits_as_input:
            logits = hidden_states
        else:
            logits = self._get_logits(lm_head, hidden_states, embedding_bias)
        if self.soft_cap is not None:
            logits = torch.tanh(logits / self.soft_cap) * self.soft_cap
        if self.scale != 1.0:
            logits = logits * self.scale
        return logits

    def _get_logits(
        self,
        lm_head: VocabParallelEmbedding,
        hidden_states: torch.Tensor,
        embedding_bias: torch.Tensor | None,
    ) -> torch.Tensor:
        """The head's raw logits [T, org_vocab_size], before soft-cap and
        scale (LogitsProcessorWithLoRA adds the LM-head LoRA to these)."""
        if getattr(lm_head, "quant_method", None) is not None:
            return self._get_logits_quantized(lm_head, hidden_states, embedding_bias)
        if get_tensor_model_parallel_world_size() > 1:
            return self._get_logits_tp(lm_head, hidden_states, embedding_bias)
        # Only the real vocabulary rows: the padding rows would be sliced off anyway,
        # and a row slice of the [vocab, hidden] weight is a free view.
        n = self.org_vocab_size
        bias = embedding_bias if embedding_bias is not None else getattr(lm_head, "bias", None)
        bias = bias[:n] if bias is not None else None
        packed = getattr(lm_head, "_packed_weight", None)
        weight = lm_head.weight[:n] if packed is None else lm_head.weight
        return unquantized_gemm(hidden_states, weight, bias, packed)

    def _get_logits_quantized(
        self,
        lm_head: VocabParallelEmbedding,
        hidden_states: torch.Tensor,
        embedding_bias: torch.Tensor | None,
    ) -> torch.Tensor:
        """A quantized head (GGUF): its method multiplies by the table; each
        rank's slice gathered, then the padding columns dropped."""
        bias = embedding_bias if embedding_bias is not None else getattr(lm_head, "bias", None)
        logits = lm_head.quant_method.apply(lm_head, hidden_states, bias)
        if get_tensor_model_parallel_world_size() > 1:
            logits = tensor_model_parallel_all_gather(logits, dim=-1)
        return logits[..., : self.org_vocab_size]

    def _get_logits_tp(
        self,
        lm_head: VocabParallelEmbedding,
        hidden_states: torch.Tensor,
        embedding_bias: torch.Tensor | None,
    ) -> torch.Tensor:
        """Each rank's [T, vocab_padded / tp] slice, gathered in rank order
        along the vocabulary, then the padding columns dropped."""
        bias = embedding_bias if embedding_bias is not None else getattr(lm_head, "bias", None)
        packed = getattr(lm_head, "_packed_weight", None)
        logits = unquantized_gemm(hidden_states, lm_head.weight, bias, packed)
        logits = tensor_model_parallel_all_gather(logits, dim=-1)
        return logits[..., : self.org_vocab_size]

    def extra_repr(self) -> str:
        return (
            f"vocab_size={self.vocab_size}, org_vocab_size={self.org_vocab_size}, "
            f"scale={self.scale}, logits_as_input={self.logits_as_input}"
        )
