"""DeepSeek-V2 (upstream: vllm/model_executor/models/deepseek_v2.py).

Attention is multi-head latent attention (MLA): keys and values come from a
compressed latent kv_c = norm(kv_a(x))[:L] plus one rotary key k_pe shared by
all heads; only [kv_c | k_pe] is cached (see backends/mla/cpu_mla.py).
Queries come from q_proj, or through a low-rank q_a -> norm -> q_b when
`q_lora_rank` is set. Rotary embeddings are interleaved (GPT-J style) over
the last qk_rope_head_dim channels of each head.

MLPs: the first `first_k_dense_replace` layers are dense; the others are MoE
with softmax routing (greedy or group-limited top-k), `routed_scaling_factor`
on the routed weights, and always-on shared experts.
On the Model Runner V2 whitelist.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import PretrainedConfig

from vllm.config import CacheConfig, VllmConfig
from vllm.model_executor.layers.fused_moe import FusedMoE
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.mla import LatentUpProjection, MLAAttention
from vllm.model_executor.layers.rotary_embedding import (
    get_rope,
    get_rope_parameters,
    rope_scaling_type,
)
from vllm.model_executor.layers.rotary_embedding.common import yarn_get_mscale
from vllm.model_executor.models.llama import LlamaForCausalLM, LlamaMLP
from vllm.model_executor.models.moe_utils import load_moe_weights
from vllm.model_executor.models.utils import extract_layer_index, norm_with_residual


def deepseek_softmax_scale(qk_head_dim: int, rope_scaling: dict[str, Any] | None) -> float:
    """qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 under YaRN scaling
    (DeepSeek-V2's reference code; transformers' `yarn_apply_mscale` and upstream
    compute the same): the part of YaRN's temperature the rotary cos/sin ratio
    (DeepseekScalingRotaryEmbedding.mscale) leaves out."""
    scale = qk_head_dim**-0.5
    if rope_scaling and rope_scaling.get("mscale_all_dim"):
        mscale = yarn_get_mscale(rope_scaling["factor"], float(rope_scaling["mscale_all_dim"]))
        scale *= mscale * mscale
    return scale


class DeepseekV2MoE(nn.Module):
    def __init__(self, config: PretrainedConfig, prefix: str = "") -> None:
        super().__init__()
        self.gate = ReplicatedLinear(
            config.hidden_size, config.n_routed_experts, bias=False, prefix=f"{prefix}.gate"
        )
        grouped = config.topk_method == "group_limited_greedy"
        self.experts = FusedMoE(
            num_experts=config.n_routed_experts,
            top_k=config.num_experts_per_tok,
            hidden_size=config.hidden_size,
            intermediate_size=config.moe_intermediate_size,
            reduce_results=True,
            renormalize=config.norm_topk_prob,
            use_grouped_topk=grouped,
            num_expert_group=config.n_group if grouped else None,
            topk_group=config.topk_group if grouped else None,
            routed_scaling_factor=config.routed_scaling_factor,
            prefix=f"{prefix}.experts",
        )
        self.shared_experts = None
        if config.n_shared_experts:
            self.shared_experts = LlamaMLP(
                config.hidden_size,
                config.moe_intermediate_size * config.n_shared_experts,
                config.hidden_act,
                prefix=f"{prefix}.shared_experts",
            )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        router_logits, _ = self.gate(hidden_states)
        out = self.experts(hidden_states, router_logits)
        if self.shared_experts is not None:
            out = out + self.shared_experts(hidden_states)
        return out


class DeepseekV2MLAAttention(nn.Module):
    def __init__(
        self, config: PretrainedConfig, cache_config: CacheConfig | None, prefix: str
    ) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.qk_nope_head_dim = config.qk_nope_head_dim
        self.qk_rope_head_dim = config.qk_rope_head_dim
        self.qk_head_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
        self.v_head_dim = config.v_head_dim
        self.q_lora_rank = config.q_lora_rank
        self.kv_lora_rank = config.kv_lora_rank
        hidden, heads = config.hidden_size, self.num_heads
        bias = getattr(config, "attention_bias", False)
        if self.q_lora_rank is not None:
            self.q_a_proj = ReplicatedLinear(
                hidden, self.q_lora_rank, bias=bias, prefix=f"{prefix}.q_a_proj"
            )
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, eps=config.rms_norm_eps)
            self.q_b_proj = ColumnParallelLinear(
                self.q_lora_rank, heads * self.qk_head_dim, bias=False, prefix=f"{prefix}.q_b_proj"
            )
        else:
            self.q_proj = ColumnParallelLinear(
                hidden, heads * self.qk_head_dim, bias=False, prefix=f"{prefix}.q_proj"
            )
        self.kv_a_proj_with_mqa = ReplicatedLinear(
            hidden,
            self.kv_lora_rank + self.qk_rope_head_dim,
            bias=bias,
            prefix=f"{prefix}.kv_a_proj_with_mqa",
        )
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, eps=config.rms_norm_eps)
        self.kv_b_proj = LatentUpProjection(
            self.kv_lora_rank,
            heads * (self.qk_nope_head_dim + self.v_head_dim),
            bias=False,
            prefix=f"{prefix}.kv_b_proj",
        )
        self.o_proj = RowParallelLinear(
            heads * self.v_head_dim, hidden, bias=bias, prefix=f"{prefix}.o_proj"
        )
        base, rope_scaling = get_rope_parameters(config)
        if rope_scaling is not None and rope_scaling_type(rope_scaling) == "yarn":
            # As upstream: DeepSeek's yarn keeps mscale / mscale_all_dim.
            rope_scaling = {**rope_scaling, "rope_type": "deepseek_yarn"}
        self.rotary_emb = get_rope(
            self.qk_rope_head_dim,
            rotary_dim=self.qk_rope_head_dim,
            max_position=config.max_position_embeddings,
            base=base,
            is_neox_style=False,
            rope_scaling=rope_scaling,
        )
        self.local_num_heads = self.kv_b_proj.output_size_per_partition // (
            self.qk_nope_head_dim + self.v_head_dim
        )
        self.mla_attn = MLAAttention(
            self.local_num_heads,
            deepseek_softmax_scale(self.qk_head_dim, rope_scaling),
            self.qk_nope_head_dim,
            self.qk_rope_head_dim,
            self.v_head_dim,
            self.q_lora_rank,
            self.kv_lora_rank,
            kv_b_proj=self.kv_b_proj,
            cache_config=cache_config,
            prefix=f"{prefix}.attn",
        )

    def _query(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.q_lora_rank is None:
            q, _ = self.q_proj(hidden_states)
        else:
            q_a, _ = self.q_a_proj(hidden_states)
            q, _ = self.q_b_proj(self.q_a_layernorm(q_a))
        return q  # [T, H * (N + R)]

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        num_tokens = hidden_states.shape[0]
        q = self._query(hidden_states).view(num_tokens, self.local_num_heads, self.qk_head_dim)
        kv_a, _ = self.kv_a_proj_with_mqa(hidden_states)  # [T, L + R]
        kv_c, k_pe = kv_a.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        kv_c_normed = self.kv_a_layernorm(kv_c.contiguous())
        q_pe, k_pe = self.rotary_emb(
            positions, q[..., self.qk_nope_head_dim :].contiguous(), k_pe.contiguous()
        )
        q = torch.cat((q[..., : self.qk_nope_head_dim], q_pe), dim=-1)
        attn_out = self.mla_attn(q.reshape(num_tokens, -1), kv_c_normed, k_pe)
        output, _ = self.o_proj(attn_out)
        return output


class DeepseekV2DecoderLayer(nn.Module):
    def __init__(self, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        assert vllm_config.model_config is not None
        config = vllm_config.model_config.hf_text_config
        self.self_attn = DeepseekV2MLAAttention(
            config, vllm_config.cache_config, prefix=f"{prefix}.self_attn"
        )
        if extract_layer_index(prefix) >= config.first_k_dense_replace:
            self.mlp: nn.Module = DeepseekV2MoE(config, prefix=f"{prefix}.mlp")
        else:
            self.mlp = LlamaMLP(
                config.hidden_size,
                config.intermediate_size,
                config.hidden_act,
                prefix=f"{prefix}.mlp",
            )
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden_states, residual = norm_with_residual(self.input_layernorm, hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class DeepseekV2ForCausalLM(LlamaForCausalLM):
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {
        "gate_up_proj": ["gate_proj", "up_proj"],
    }
    # MLA reads kv_b_proj's weight directly (absorbed into the attention), so a
    # LoRA wrapper around it would never run: no LoRA for this model.
    supports_lora: ClassVar[bool] = False

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=DeepseekV2DecoderLayer)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        experts = FusedMoE.make_expert_params_mapping(
            "gate_proj", "down_proj", "up_proj", self.config.n_routed_experts
        )
        skip = ["lm_head."] if getattr(self.config, "tie_word_embeddings", False) else []
        return load_moe_weights(self, weights, self.stacked_params_mapping[3:], experts, skip)
