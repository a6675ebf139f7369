"""GPTQ checkpoints (AutoGPTQ / GPTQModel / optimum), 4-bit, kept int4 and run
on torch's CPU int4 kernel (upstream: vllm/model_executor/layers/quantization/gptq.py).

Checkpoint tensors per linear (K = in features, N = out features, g = group size):
  qweight  int32 [K / 8, N]: packed along the INPUT dim; word r of column n
           holds inputs 8r..8r+7, input 8r+j in bits [4j, 4j+4) (unsigned 0..15);
  qzeros   int32 [K / g, N / 8]: packed along the OUTPUT dim, same nibble order;
           GPTQ v1 checkpoints (checkpoint_format "gptq", the default) store
           zero - 1, GPTQ v2 ("gptq_v2") the zero itself;
  scales   float [K / g, N];
  g_idx    int32 [K]: the group of each input. With desc_act=false it is
           k // g; with desc_act=true (act-order) the inputs were quantized in
           another order, so a group's inputs are scattered over K.
The dense weight is w[n, k] = (q[k, n] - zero[g_idx[k], n]) * scales[g_idx[k], n].

quantization_config keys read: bits, group_size, desc_act, lm_head, dynamic,
checkpoint_format, modules_in_block_to_quantize ("sym" needs nothing: the zeros
are read from qzeros either way).

Once loaded each layer is repacked for utils/int4_cpu.py: u = q, zero =
(8 - z) * s, so the kernel's (u - 8) * s + zero is (q - z) * s (a float32
model: int8 groups for the int8 group GEMM, same values). desc_act: the
inputs are sorted by group (g_idx_sort_indices, applied to x's columns at run
time); a row-parallel rank whose slice holds only part of some groups pads
each of them to g inputs with zero activations.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parameter import Parameter

from vllm.model_executor.layers.linear import LinearWeightSpec
from vllm.model_executor.layers.quantization.base_config import (
    CPUQuantizationConfig,
    QuantizeMethodBase,
)
from vllm.model_executor.layers.quantization.utils.gptq_utils import (
    Int4CPULinearMethod,
    get_linear_quant_method,
    int4_params,
    regroup_by_g_idx,
)
from vllm.model_executor.layers.quantization.utils.int4_cpu import INT4_GROUP_SIZES
from vllm.model_executor.layers.quantization.utils.quant_utils import unpack_from_int32
from vllm.model_executor.utils import set_weight_attrs

_FORMATS = ("gptq", "gptq_v2")


class GPTQConfig(CPUQuantizationConfig):
    """A GPTQ checkpoint's `quantization_config` (or quantize_config.json)."""

    def __init__(
        self,
        weight_bits: int,
        group_size: int,
        desc_act: bool,
        lm_head_quantized: bool,
        dynamic: dict[str, Any],
        autoround_version: str = "",
        modules_in_block_to_quantize: list[str] | None = None,
        checkpoint_format: str = "",
    ) -> None:
        super().__init__()
        if weight_bits != 4:
            raise ValueError(
                f"GPTQ bits={weight_bits} is not built here (built: bits=4, on torch's CPU "
                "int4 kernel)."
            )
        if group_size not in INT4_GROUP_SIZES:
            raise ValueError(
                f"GPTQ group_size={group_size} is not built here (built: {INT4_GROUP_SIZES})."
            )
        if lm_head_quantized:
            raise ValueError("GPTQ lm_head=true (a quantized LM head) is not built here.")
        if dynamic:
            raise ValueError(
                "GPTQ dynamic (GPTQModel's per-module overrides) is not built here; "
                f"got rules for {sorted(dynamic)}."
            )
        if checkpoint_format and checkpoint_format not in _FORMATS:
            raise ValueError(
                f"GPTQ checkpoint_format={checkpoint_format!r} is not built here "
                f"(built: {_FORMATS})."
            )
        self.weight_bits = weight_bits
        self.group_size = group_size
        self.desc_act = desc_act
        self.lm_head_quantized = lm_head_quantized
        self.dynamic = dynamic
        self.autoround_version = autoround_version
        self.modules_in_block_to_quantize = modules_in_block_to_quantize or []
        self.checkpoint_format = checkpoint_format
        # v1 stores zero - 1 in qzeros, v2 the zero itself.
        self.use_v2_format = checkpoint_format == "gptq_v2"
        self.pack_factor = 32 // weight_bits

    def __repr__(self) -> str:
        return (
            f"GPTQConfig(weight_bits={self.weight_bits}, group_size={self.group_size}, "
            f"desc_act={self.desc_act}, checkpoint_format={self.checkpoint_format!r})"
        )

    def get_name(self) -> str:
        return "gptq"

    @staticmethod
    def get_config_filenames() -> list[str]:
        return ["quantize_config.json"]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> GPTQConfig:
        modules = cls.get_from_keys_or(config, ["modules_in_block_to_quantize"], None)
        if modules and all(isinstance(m, list) for m in modules):
            modules = [name for block in modules for name in block]
        return cls(
            weight_bits=int(cls.get_from_keys(config, ["bits"])),
            group_size=int(cls.get_from_keys(config, ["group_size"])),
            desc_act=bool(cls.get_from_keys(config, ["desc_act"])),
            lm_head_quantized=bool(cls.get_from_keys_or(config, ["lm_head"], False)),
            dynamic=cls.get_from_keys_or(config, ["dynamic"], None) or {},
            autoround_version=str(cls.get_from_keys_or(config, ["autoround_version"], "")),
            modules_in_block_to_quantize=modules,
            checkpoint_format=str(cls.get_from_keys_or(config, ["checkpoint_format"], "")),
        )

    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        only = self.modules_in_block_to_quantize
        return get_linear_quant_method(self, layer, prefix, GPTQLinearMethod, only=only)


class GPTQLinearMethod(Int4CPULinearMethod):
    """A linear layer's GPTQ tensors, repacked for the CPU int4 kernel."""

    quant_config: GPTQConfig

    def create_linear_weights(self, layer: Any, spec: LinearWeightSpec) -> None:
        input_size = spec.input_size
        # act-order on a row-parallel rank: a group's inputs are spread over
        # the ranks, so every rank keeps all the groups' scales and zeros.
        groups_whole = self.quant_config.desc_act and input_size != spec.input_size_per_partition
        g, pf, k, n = self.int4_partition(layer, spec, groups_whole)
        groups = input_size // g if groups_whole else k // g
        loader = spec.weight_loader
        group_dim = None if groups_whole else 0
        int4_params(
            layer,
            loader,
            qweight=((k // pf, n), torch.int32, dict(input_dim=0, output_dim=1, packed_dim=0)),
            qzeros=(
                (groups, n // pf),
                torch.int32,
                dict(input_dim=group_dim, output_dim=1, packed_dim=1),
            ),
            scales=((groups, n), spec.params_dtype, dict(input_dim=group_dim, output_dim=1)),
            pack_factor=pf,
        )
        g_idx = Parameter(torch.empty(k, dtype=torch.int32), requires_grad=False)
        set_weight_attrs(g_idx, {"weight_loader": loader, "input_dim": 0})
        layer.register_parameter("g_idx", g_idx)
        layer.input_size_per_partition = k

    def process_weights_after_loading(self, layer: Any) -> None:
        """Unpack qweight / qzeros, fold the zeros into the kernel's (scale,
        zero) pairs, sort act-order inputs by group, repack (module docstring)."""
        cfg = self.quant_config
        k, n = layer.input_size_per_partition, layer.qweight.shape[1]
        u = unpack_from_int32(layer.qweight.data.t().contiguous(), cfg.weight_bits, k)  # [n, k]
        z = unpack_from_int32(layer.qzeros.data, cfg.weight_bits, n)  # [groups, n]
        if not cfg.use_v2_format:
            z = z + 1
        s = layer.scales.data
        zero = (8 - z).to(s.dtype) * s
        g_idx = layer.g_idx.data.to(torch.int64)
        offset = layer.tp_rank * k if layer.input_size != k else 0
        if cfg.desc_act:
            index, u, s, zero = regroup_by_g_idx(u, g_idx, s, zero, cfg.group_size, layer.prefix)
            if not torch.equal(index, torch.arange(k)):  # else already in group order
                layer.g_idx_sort_indices = Parameter(index, requires_grad=False)
                layer.gptq_pad_input = bool(int(index.max()) == k)
        elif not torch.equal(g_idx, (torch.arange(k) + offset) // cfg.group_size):
            raise ValueError(
                f"{layer.prefix}: g_idx is not k // group_size although desc_act=false "
                "(an act-order checkpoint whose config says otherwise?)."
            )
        del layer.g_idx
        self.store_int4(layer, u, s.t(), zero.t())

    def apply(  # type: ignore[override]
        self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        index = getattr(layer, "g_idx_sort_indices", None)
        if index is not None:
            if layer.gptq_pad_input:  # index k: a zero input padding a partial group
                x = torch.cat([x, x.new_zeros(*x.shape[:-1], 1)], dim=-1)
            x = x.index_select(-1, index)
        return super().apply(layer, x, bias)
