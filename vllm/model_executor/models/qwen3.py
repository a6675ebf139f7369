"""Qwen3 for causal LM (upstream: vllm/model_executor/models/qwen3.py).

Llama's decoder with per-head RMSNorm on q and k (before rotary) and, by
default, no q/k/v bias.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PretrainedConfig

from vllm.config import VllmConfig
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.models.adapters import as_seq_cls_model
from vllm.model_executor.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM


class Qwen3Attention(LlamaAttention):
    def __init__(self, config: PretrainedConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def _qk_transform(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalize each head: q [T, heads * head_dim] viewed as [T, heads, head_dim]."""
        num_tokens = q.shape[0]
        q = self.q_norm(q.view(num_tokens, self.num_heads, self.head_dim))
        k = self.k_norm(k.view(num_tokens, self.num_kv_heads, self.head_dim))
        return q.view(num_tokens, self.q_size), k.view(num_tokens, self.kv_size)


class Qwen3DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen3Attention

    @classmethod
    def _attention_biases(cls, config: PretrainedConfig) -> tuple[bool, bool]:
        return bool(getattr(config, "attention_bias", False)), False


class Qwen3ForCausalLM(LlamaForCausalLM):
    def __init__(
        self,
        *,
        vllm_config: VllmConfig,
        prefix: str = "",
        layer_type: type[LlamaDecoderLayer] = Qwen3DecoderLayer,
    ) -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=layer_type)


# HF's Qwen3ForSequenceClassification: the body plus a bias-free `score` head
# over the last token (runner="pooling"; see models/adapters.py).
Qwen3ForSequenceClassification = as_seq_cls_model(Qwen3ForCausalLM)
