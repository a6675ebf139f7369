"""The weight loader shared by the mixture-of-experts models here (Mixtral,
Qwen2-MoE, DeepSeek-V2): it routes per-expert checkpoint tensors into
`FusedMoE`'s stacked parameters. (Their decoder layers are Llama's, with the
MLP built by `LlamaDecoderLayer._make_mlp`.)"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from vllm.model_executor.model_loader.weight_utils import get_weight_loader
from vllm.model_executor.models.utils import (
    AutoWeightsLoader,
    is_pp_missing_parameter,
    load_stacked_weight,
    lookup_param,
)

# (param name part, checkpoint name part, expert id, shard id), from
# FusedMoE.make_expert_params_mapping.
ExpertMapping = list[tuple[str, str, int, str]]
StackedMapping = list[tuple[str, str, str | int]]


def load_moe_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    stacked_params_mapping: StackedMapping,
    expert_params_mapping: ExpertMapping,
    skip_prefixes: Iterable[str] = (),
) -> set[str]:
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
        target = _load_one(
            model, params, name, weight, stacked_params_mapping, expert_params_mapping
        )
        if target is not None:
            loaded.add(target)
    return loaded


def _load_one(
    model: nn.Module,
    params: dict[str, nn.Parameter],
    name: str,
    weight: torch.Tensor,
    stacked: StackedMapping,
    experts: ExpertMapping,
) -> str | None:
    """Load one checkpoint tensor; the parameter name, or None when another
    pipeline stage owns it."""
    for param_part, weight_part, expert_id, shard_id in experts:
        if weight_part in name:
            target = name.replace(weight_part, param_part)
            if is_pp_missing_parameter(target, model):
                return None
            param = lookup_param(params, target, name)
            get_weight_loader(param)(param, weight, name, shard_id=shard_id, expert_id=expert_id)
            return target
    return load_stacked_weight(model, params, name, weight, stacked)
