"""Pieces shared by the mixture-of-experts models here (Mixtral, Qwen2-MoE,
GraniteMoE, DeepSeek-V2): a pre-norm decoder layer around Llama's attention
with a pluggable MLP, and a weight loader that routes per-expert checkpoint
tensors into `FusedMoE`'s stacked parameters."""
from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn
from transformers import PretrainedConfig

from vllm.config import VllmConfig
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.models.llama import LlamaAttention
from vllm.model_executor.models.utils import (AutoWeightsLoader, is_pp_missing_parameter,
                                              load_stacked_weight, lookup_param,
                                              norm_with_residual)

# (param name part, checkpoint name part, expert id, shard id), from
# FusedMoE.make_expert_params_mapping.
ExpertMapping = list[tuple[str, str, int, str]]
StackedMapping = list[tuple[str, str, str | int]]


class MoEDecoderLayer(nn.Module):
    """Llama's pre-norm block, x + attn(norm(x)) then + mlp(norm(.)), where
    `mlp_fn(config, prefix)` builds the MLP (a MoE block or a dense MLP)."""

    def __init__(self, vllm_config: VllmConfig, prefix: str,
                 mlp_fn: Callable[[PretrainedConfig, str], nn.Module],
                 qkv_bias: bool = False) -> None:
        super().__init__()
        config = vllm_config.model_config.hf_text_config
        self.self_attn = LlamaAttention(
            config=config, hidden_size=config.hidden_size,
            num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            max_position_embeddings=config.max_position_embeddings,
            bias=qkv_bias, cache_config=vllm_config.cache_config,
            prefix=f"{prefix}.self_attn")
        self.mlp = mlp_fn(config, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        hidden_states, residual = norm_with_residual(self.input_layernorm, hidden_states, residual)
        hidden_states = self.self_attn(positions=positions, hidden_states=hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


def load_moe_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                     stacked_params_mapping: StackedMapping,
                     expert_params_mapping: ExpertMapping,
                     skip_prefixes: Iterable[str] = ()) -> set[str]:
    """Load a whole MoE model by its full parameter names.

    A per-expert tensor ("...experts.3.gate_proj.weight") goes into its slot
    of the stacked expert parameter ("...experts.w13_weight", expert 3, w1);
    expert names are matched first because they also contain the dense
    names (".gate_proj"). Then fused dense shards, then plain parameters.
    """
    params = dict(model.named_parameters())
    skip_prefixes = tuple(skip_prefixes)
    skip_substrs = tuple(AutoWeightsLoader.ROTARY_EMBEDS_UNUSED_WEIGHTS)
    loaded: set[str] = set()
    for name, weight in weights:
        if name.startswith(skip_prefixes) or any(s in name for s in skip_substrs):
            continue
        target = _load_one(model, params, name, weight, stacked_params_mapping,
                           expert_params_mapping)
        if target is not None:
            loaded.add(target)
    return loaded


def _load_one(model: nn.Module, params: dict[str, nn.Parameter], name: str,
              weight: torch.Tensor, stacked: StackedMapping,
              experts: ExpertMapping) -> str | None:
    """Load one checkpoint tensor; the parameter name, or None when another
    pipeline stage owns it."""
    for param_part, weight_part, expert_id, shard_id in experts:
        if weight_part in name:
            target = name.replace(weight_part, param_part)
            if is_pp_missing_parameter(target, model):
                return None
            param = lookup_param(params, target, name)
            param.weight_loader(param, weight, name, shard_id=shard_id, expert_id=expert_id)
            return target
    return load_stacked_weight(model, params, name, weight, stacked)
