"""Qwen3.5 text model (upstream: vllm/model_executor/models/qwen3_5.py, built on
qwen3_next.py): a hybrid of Gated DeltaNet linear attention and gated full
attention, per `layer_types` (three linear layers per full one by default).

- linear layers: `GatedDeltaNet` with per-request conv + recurrent state in a
  Mamba-type KV cache group (one slot per request);
- full layers: q_proj yields per head [q; gate]; q/k get (1 + w) RMSNorm per
  head, rotary covers the first `partial_rotary_factor` of each head, and the
  attention output is scaled by sigmoid(gate); K/V live in the paged cache
  (a second, full-attention KV cache group);
- every norm is (1 + w) RMSNorm; the MLP is SwiGLU.

`IsHybrid` + `HasInnerState`: by the seed's rule it runs on the V1 runner.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import PretrainedConfig

from vllm.config import CacheConfig, VllmConfig
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear
from vllm.model_executor.layers.mamba.gated_delta_net import GatedDeltaNet
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.models.gemma2 import GemmaRMSNorm
from vllm.model_executor.models.interfaces import HasInnerState, IsHybrid
from vllm.model_executor.models.llama import LlamaForCausalLM, LlamaMLP
from vllm.model_executor.models.utils import (
    CausalLMBase,
    extract_layer_index,
    load_stacked_weights,
    make_layers,
    maybe_prefix,
    norm_with_residual,
    single_stage_embeds,
)


class Qwen3_5Attention(nn.Module):
    def __init__(
        self, config: PretrainedConfig, cache_config: CacheConfig | None, prefix: str
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden, d = config.hidden_size, self.head_dim
        bias = getattr(config, "attention_bias", False)
        self.q_proj = ColumnParallelLinear(
            hidden, self.num_heads * d * 2, bias=bias, prefix=f"{prefix}.q_proj"
        )
        self.k_proj = ColumnParallelLinear(
            hidden, self.num_kv_heads * d, bias=bias, prefix=f"{prefix}.k_proj"
        )
        self.v_proj = ColumnParallelLinear(
            hidden, self.num_kv_heads * d, bias=bias, prefix=f"{prefix}.v_proj"
        )
        self.o_proj = RowParallelLinear(
            self.num_heads * d, hidden, bias=bias, prefix=f"{prefix}.o_proj"
        )
        self.q_norm = GemmaRMSNorm(d, eps=config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(d, eps=config.rms_norm_eps)
        rope = dict(getattr(config, "rope_parameters", None) or {})
        if rope.get("rope_type", "default") != "default":
            raise NotImplementedError(f"Qwen3.5 rope type {rope['rope_type']!r} is not built.")
        self.rotary_emb = get_rope(
            d,
            rotary_dim=d,
            max_position=config.max_position_embeddings,
            base=rope.get("rope_theta", 10000.0),
            is_neox_style=True,
            partial_rotary_factor=rope.get("partial_rotary_factor", 1.0),
        )
        self.attn = Attention(
            self.num_heads,
            d,
            d**-0.5,
            num_kv_heads=self.num_kv_heads,
            cache_config=cache_config,
            prefix=f"{prefix}.attn",
        )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        t, d = hidden_states.shape[0], self.head_dim
        q_gate, _ = self.q_proj(hidden_states)
        q, gate = q_gate.view(t, self.num_heads, 2 * d).chunk(2, dim=-1)  # per head [q; gate]
        k, _ = self.k_proj(hidden_states)
        v, _ = self.v_proj(hidden_states)
        q = self.q_norm(q).reshape(t, -1)
        k = self.k_norm(k.view(t, self.num_kv_heads, d)).reshape(t, -1)
        q, k = self.rotary_emb(positions, q, k)
        out = self.attn(q, k, v) * torch.sigmoid(gate.reshape(t, -1))
        out, _ = self.o_proj(out)
        return out


class Qwen3_5DecoderLayer(nn.Module):
    def __init__(self, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        assert vllm_config.model_config is not None
        config = vllm_config.model_config.hf_text_config
        self.layer_type = config.layer_types[extract_layer_index(prefix)]
        if self.layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(
                config.hidden_size,
                config.linear_num_key_heads,
                config.linear_num_value_heads,
                config.linear_key_head_dim,
                config.linear_value_head_dim,
                config.linear_conv_kernel_dim,
                config.rms_norm_eps,
                prefix=f"{prefix}.linear_attn",
            )
        elif self.layer_type == "full_attention":
            self.self_attn = Qwen3_5Attention(
                config, vllm_config.cache_config, prefix=f"{prefix}.self_attn"
            )
        else:
            raise ValueError(f"Unknown Qwen3.5 layer type {self.layer_type!r}.")
        self.mlp = LlamaMLP(
            config.hidden_size, config.intermediate_size, config.hidden_act, prefix=f"{prefix}.mlp"
        )
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden_states, residual = norm_with_residual(self.input_layernorm, hidden_states, residual)
        if self.layer_type == "linear_attention":
            hidden_states = self.linear_attn(hidden_states)
        else:
            hidden_states = self.self_attn(positions, hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class Qwen3_5Model(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        assert vllm_config.model_config is not None
        config = vllm_config.model_config.hf_text_config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.start_layer, self.end_layer, self.layers = make_layers(
            config.num_hidden_layers,
            lambda p: Qwen3_5DecoderLayer(vllm_config=vllm_config, prefix=p),
            prefix=f"{prefix}.layers",
        )
        self.norm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden_states = single_stage_embeds(
            self, self.embed_tokens, input_ids, intermediate_tensors, inputs_embeds
        )
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_stacked_weights(self, weights, LlamaForCausalLM.stacked_params_mapping[3:])


class Qwen3_5ForCausalLM(CausalLMBase, HasInnerState, IsHybrid):
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        assert vllm_config.model_config is not None
        config = vllm_config.model_config.hf_text_config
        self.config = config
        self.model = Qwen3_5Model(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.init_lm_head(
            config,
            prefix,
            self.model.embed_tokens,
            tie=getattr(config, "tie_word_embeddings", False),
        )
