"""Helpers shared by GPTQ and AWQ (upstream:
vllm/model_executor/layers/quantization/utils/gptq_utils.py): which layers a
config quantizes, their [in, out]-major int4 parameters, the linear method
both repack into (`Int4CPULinearMethod`), and act-order regrouping."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import Parameter

from vllm.model_executor.layers.linear import (
    LinearBase,
    LinearMethodBase,
    LinearWeightSpec,
    UnquantizedLinearMethod,
)
from vllm.model_executor.layers.quantization.base_config import (
    QuantizationConfig,
    QuantizeMethodBase,
)
from vllm.model_executor.layers.quantization.utils.int4_cpu import int4_cpu_linear, pack_int4_cpu
from vllm.model_executor.layers.quantization.utils.quant_utils import fused_shard_names
from vllm.model_executor.utils import set_weight_attrs


def get_linear_quant_method(
    config: QuantizationConfig,
    layer: nn.Module,
    prefix: str,
    linear_method_cls: Callable[[Any], LinearMethodBase],
    skip: list[str] | None = None,
    only: list[str] | None = None,
) -> QuantizeMethodBase | None:
    """The method of `layer` for GPTQ / AWQ, which quantize linear layers
    only: None for any other layer, the dense method for a linear whose name
    contains one of `skip` (AWQ's modules_to_not_convert) or none of a
    non-empty `only` (GPTQ's modules_in_block_to_quantize), else
    `linear_method_cls(config)`."""
    if not isinstance(layer, LinearBase):
        return None
    mapping = config.packed_modules_mapping
    quantized = is_layer_quantized(prefix, mapping, skip, skip=True) and is_layer_quantized(
        prefix, mapping, only, skip=False
    )
    return linear_method_cls(config) if quantized else UnquantizedLinearMethod()


def is_layer_quantized(
    prefix: str, packed_modules_mapping: dict[str, list[str]], names: list[str] | None, skip: bool
) -> bool:
    """Whether the layer `prefix` is quantized, given a list of module-name
    substrings: the modules to skip (`skip`: AWQ's modules_to_not_convert) or
    the only ones quantized (GPTQ's modules_in_block_to_quantize; empty: all).
    The parts of a fused layer must agree (a ValueError naming it if not)."""
    if not names:
        return True
    verdicts = {
        any(name in shard for name in names) != skip
        for shard in fused_shard_names(prefix, packed_modules_mapping)
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


class Int4CPULinearMethod(LinearMethodBase):
    """The int4 linear GPTQ and AWQ repack into: `qweight` / `scales` as
    `pack_int4_cpu` stores them, run by `int4_cpu_linear` with the config's
    group size. `layer` is typed Any: the attributes read are those the
    subclass's `create_linear_weights` sets."""

    def __init__(self, quant_config: Any) -> None:
        self.quant_config = quant_config

    def int4_partition(
        self, layer: Any, spec: LinearWeightSpec, groups_whole: bool = False
    ) -> tuple[int, int, int, int]:
        """(group size, pack factor, k, n) of this rank's [k, n] slice, which
        must hold whole int32 words and groups (`check_int4_partition`)."""
        g, pf = self.quant_config.group_size, self.quant_config.pack_factor
        k, n = spec.input_size_per_partition, spec.output_size_per_partition
        method = self.quant_config.get_name().upper()
        check_int4_partition(layer, method, k, n, g, pf, groups_whole=groups_whole)
        return g, pf, k, n

    def store_int4(
        self, layer: Any, u: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor
    ) -> None:
        """Replace the checkpoint's tensors by the kernel's: u int [n, k] in
        0..15, scale / zero [n, groups] with w = (u - 8) * scale + zero."""
        packed, scale_and_zero = pack_int4_cpu(u, scale, zero)
        del layer.qzeros
        layer.qweight = Parameter(packed, requires_grad=False)
        layer.scales = Parameter(scale_and_zero, requires_grad=False)

    def apply(  # type: ignore[override]
        self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return int4_cpu_linear(x, layer.qweight, layer.scales, self.quant_config.group_size, bias)


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
