"""Helpers shared by GPTQ and AWQ (upstream:
vllm/model_executor/layers/quantization/utils/gptq_utils.py): which layers a
config quantizes, their [in, out]-major int4 parameters, and act-order regrouping."""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.parameter import Parameter

from vllm.model_executor.utils import set_weight_attrs


def _shard_names(prefix: str, packed_modules_mapping: dict[str, list[str]]) -> list[str]:
    """The checkpoint modules a (possibly fused) layer stands for."""
    head, _, last = prefix.rpartition(".")
    parts = packed_modules_mapping.get(last)
    if not parts:
        return [prefix]
    return [f"{head}.{part}" if head else part for part in parts]


def is_layer_quantized(
    prefix: str, packed_modules_mapping: dict[str, list[str]], names: list[str], skip: bool
) -> bool:
    """Whether the layer `prefix` is quantized, given a list of module-name
    substrings: the modules to skip (`skip`: AWQ's modules_to_not_convert) or
    the only ones quantized (GPTQ's modules_in_block_to_quantize; empty: all).
    The parts of a fused layer must agree (a ValueError naming it if not)."""
    if not names:
        return True
    verdicts = {
        any(name in shard for name in names) != skip
        for shard in _shard_names(prefix, packed_modules_mapping)
    }
    if len(verdicts) > 1:
        raise ValueError(
            f"The parts of fused layer {prefix!r} are not all quantized ({names}); "
            "this is not supported."
        )
    return verdicts.pop()


def check_int4_partition(
    layer: Any, method: str, k: int, n: int, group: int, pack: int, groups_whole: bool = False
) -> None:
    """This rank's [k, n] slice must hold whole int32 words along both packed
    dims and whole groups along the input (unless every rank keeps all groups)."""
    problems = []
    if k % pack or (not groups_whole and k % group):
        problems.append(f"input size {k} per rank is not a multiple of group_size={group}")
    if n % pack:
        problems.append(f"output size {n} per rank is not a multiple of {pack} (one int32)")
    if problems:
        raise ValueError(
            f"{method} layer {getattr(layer, 'prefix', '')!r}: {'; '.join(problems)}; "
            "choose another tensor-parallel size."
        )


def int4_params(
    layer: Any,
    weight_loader: Any,
    pack_factor: int,
    **params: tuple[tuple[int, ...], torch.dtype, dict[str, Any]],
) -> None:
    """Register `name=(shape, dtype, attrs)` parameters with the loader and
    their dim attributes (`pack_factor` added to those with a packed_dim)."""
    for name, (shape, dtype, attrs) in params.items():
        param = Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
        extra = {"pack_factor": pack_factor} if "packed_dim" in attrs else {}
        set_weight_attrs(param, {"weight_loader": weight_loader, **attrs, **extra})
        layer.register_parameter(name, param)


def regroup_by_g_idx(
    u: torch.Tensor,
    g_idx: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    group: int,
    prefix: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Act-order (desc_act) inputs sorted so each group's are contiguous.

    u [n, k] int4 values of this rank's inputs, g_idx [k] their global groups,
    scale / zero [groups, n]. Returns (index, u', scale', zero'): index
    [G' * group] picks x's columns (k: a zero column padding a group that is
    only partly on this rank), u' = u's columns in that order (8 for pads,
    whose activation is 0), and the G' groups present's scale / zero rows."""
    n, k = u.shape
    if k and (int(g_idx.min()) < 0 or int(g_idx.max()) >= scale.shape[0]):
        raise ValueError(f"{prefix}: g_idx holds groups outside [0, {scale.shape[0]}).")
    present, counts = torch.unique(g_idx, return_counts=True)  # sorted
    if bool((counts > group).any()):
        raise ValueError(f"{prefix}: g_idx puts more than group_size={group} inputs in a group.")
    order = torch.argsort(g_idx, stable=True)
    rank_of = torch.searchsorted(present, g_idx[order])  # group's position among present
    starts = torch.cumsum(counts, 0) - counts
    slot = rank_of * group + (torch.arange(k) - starts[rank_of])
    index = torch.full((present.numel() * group,), k, dtype=torch.int64)
    index[slot] = order
    u_padded = torch.cat([u, torch.full((n, 1), 8, dtype=u.dtype)], dim=1)
    return index, u_padded[:, index].contiguous(), scale[present], zero[present]
