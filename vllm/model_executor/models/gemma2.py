"""Gemma 2 for causal LM (upstream: vllm/model_executor/models/gemma2.py).

What sets it apart from Llama:
- RMSNorm scales by (1 + weight), computed in float32 (`GemmaRMSNorm`);
- the token embeddings are multiplied by sqrt(hidden_size);
- four norms per block: after attention and around the MLP ("sandwich");
- attention scores are soft-capped (cap * tanh(s / cap)) and scaled by
  query_pre_attn_scalar^-0.5 instead of head_dim^-0.5;
- layers alternate sliding-window and full attention (`layer_types`); a
  sliding layer asks for a `SlidingWindowSpec` KV cache;
- the final logits are soft-capped too, and the head is tied.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import PretrainedConfig

from vllm.config import CacheConfig, VllmConfig
from vllm.model_executor.layers.activation import GeluAndMul
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.rotary_embedding import get_rope, get_rope_parameters
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.models.interfaces import SupportsLoRA
from vllm.model_executor.models.llama import LlamaForCausalLM, get_layer_sliding_window
from vllm.model_executor.models.utils import (
    CausalLMBase,
    extract_layer_index,
    load_stacked_weights,
    make_layers,
    maybe_prefix,
    norm_with_residual,
    single_stage_embeds,
)


class GemmaRMSNorm(nn.Module):
    """x / rms(x) * (1 + weight), in float32, cast back to x's dtype; with a
    residual it first adds it and also returns the sum (fused-add form)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size), requires_grad=False)
        self.variance_epsilon = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
            residual = x
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        out = (out * (1.0 + self.weight.float())).to(x.dtype)
        return out if residual is None else (out, residual)


class Gemma2MLP(nn.Module):
    def __init__(
        self, hidden_size: int, intermediate_size: int, hidden_act: str, prefix: str = ""
    ) -> None:
        super().__init__()
        if hidden_act not in ("gelu_pytorch_tanh", "gelu_new", "gelu"):
            raise ValueError(f"Gemma2 activation {hidden_act!r} is not supported.")
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size] * 2, bias=False, prefix=f"{prefix}.gate_up_proj"
        )
        self.down_proj = RowParallelLinear(
            intermediate_size, hidden_size, bias=False, prefix=f"{prefix}.down_proj"
        )
        self.act_fn = GeluAndMul("none" if hidden_act == "gelu" else "tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, _ = self.gate_up_proj(x)
        x, _ = self.down_proj(self.act_fn(gate_up))
        return x


class Gemma2Attention(nn.Module):
    def __init__(
        self, config: PretrainedConfig, cache_config: CacheConfig | None, prefix: str
    ) -> None:
        super().__init__()
        num_heads, num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        bias = config.attention_bias
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            self.head_dim,
            num_heads,
            num_kv_heads,
            bias=bias,
            prefix=f"{prefix}.qkv_proj",
        )
        self.q_size = self.qkv_proj.num_heads * self.head_dim
        self.kv_size = self.qkv_proj.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(
            num_heads * self.head_dim, config.hidden_size, bias=bias, prefix=f"{prefix}.o_proj"
        )
        base, rope_scaling = get_rope_parameters(config)
        self.rotary_emb = get_rope(
            self.head_dim,
            rotary_dim=self.head_dim,
            max_position=config.max_position_embeddings,
            base=base,
            is_neox_style=True,
            rope_scaling=rope_scaling,
        )
        self.attn = Attention(
            self.qkv_proj.num_heads,
            self.head_dim,
            config.query_pre_attn_scalar**-0.5,
            num_kv_heads=self.qkv_proj.num_kv_heads,
            cache_config=cache_config,
            logits_soft_cap=config.attn_logit_softcapping,
            per_layer_sliding_window=get_layer_sliding_window(config, extract_layer_index(prefix)),
            prefix=f"{prefix}.attn",
        )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        output, _ = self.o_proj(self.attn(q, k, v))
        return output


class Gemma2DecoderLayer(nn.Module):
    """Sandwich norms: x + post_attn_norm(attn(in_norm(x))), then
    + post_ffw_norm(mlp(pre_ffw_norm(.))). The residual stream is carried
    separately, as in Llama, so the input norms fuse the residual add."""

    def __init__(
        self, config: PretrainedConfig, cache_config: CacheConfig | None, prefix: str
    ) -> None:
        super().__init__()
        self.self_attn = Gemma2Attention(config, cache_config, prefix=f"{prefix}.self_attn")
        self.mlp = Gemma2MLP(
            config.hidden_size,
            config.intermediate_size,
            config.hidden_activation,
            prefix=f"{prefix}.mlp",
        )
        eps = config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps)

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden_states, residual = norm_with_residual(self.input_layernorm, hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states)
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states, residual = self.pre_feedforward_layernorm(hidden_states, residual)
        hidden_states = self.post_feedforward_layernorm(self.mlp(hidden_states))
        return hidden_states, residual


class Gemma2Model(nn.Module):
    normalizer: torch.Tensor  # a buffer (register_buffer)

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        assert vllm_config.model_config is not None
        config = vllm_config.model_config.hf_text_config
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.start_layer, self.end_layer, self.layers = make_layers(
            config.num_hidden_layers,
            lambda p: Gemma2DecoderLayer(config, vllm_config.cache_config, prefix=p),
            prefix=f"{prefix}.layers",
        )
        self.norm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        # sqrt(hidden_size), rounded to the model dtype as transformers does.
        self.register_buffer("normalizer", torch.tensor(config.hidden_size**0.5), persistent=False)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        inputs_embeds = single_stage_embeds(
            self, self.embed_tokens, input_ids, intermediate_tensors, inputs_embeds
        )
        hidden_states = inputs_embeds * self.normalizer.to(inputs_embeds.dtype)
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_stacked_weights(self, weights, LlamaForCausalLM.stacked_params_mapping)


class Gemma2ForCausalLM(CausalLMBase, SupportsLoRA):
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = dict(
        LlamaForCausalLM.packed_modules_mapping
    )
    # As upstream: LoRA on the projections only (no embedding_modules, so an
    # adapter of embed_tokens / lm_head is refused by name).

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        assert vllm_config.model_config is not None
        config = vllm_config.model_config.hf_text_config
        self.config = config
        self.model = Gemma2Model(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        # Gemma ties the head to the embeddings.
        self.init_lm_head(
            config,
            prefix,
            self.model.embed_tokens,
            tie=True,
            soft_cap=config.final_logit_softcapping,
        )
