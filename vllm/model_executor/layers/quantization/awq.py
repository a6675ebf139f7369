"""AWQ checkpoints (AutoAWQ / llm-awq "GEMM" layout), 4-bit with zero points,
kept int4 and run on torch's CPU int4 kernel (a float32 model: as int8 groups
on the int8 group GEMM, utils/int4_cpu.py) (upstream:
vllm/model_executor/layers/quantization/awq.py).

Checkpoint tensors per linear (K = in features, N = out features, g = group size):
  qweight  int32 [K, N / 8]: packed along the OUTPUT dim; the 8 nibbles of a
           word (nibble j in bits [4j, 4j+4)) hold the word's outputs in AWQ's
           order (0, 2, 4, 6, 1, 3, 5, 7): output c of the word is nibble
           AWQ_REVERSE_ORDER[c] = (0, 4, 1, 5, 2, 6, 3, 7)[c];
  qzeros   int32 [K / g, N / 8]: the zero points, packed the same way
           (stored as is, unsigned 0..15: no GPTQ-style "- 1");
  scales   float [K / g, N].
The dense weight is w[n, k] = (q[k, n] - zeros[k // g, n]) * scales[k // g, n].

quantization_config keys read: w_bit / bits, q_group_size / group_size,
zero_point, modules_to_not_convert (module-name substrings kept dense), version
(only "gemm": GEMV / GEMV-fast / Marlin layouts differ).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vllm.model_executor.layers.linear import LinearWeightSpec
from vllm.model_executor.layers.quantization.base_config import (
    CPUQuantizationConfig,
    QuantizeMethodBase,
)
from vllm.model_executor.layers.quantization.utils.gptq_utils import (
    Int4CPULinearMethod,
    get_linear_quant_method,
    int4_params,
)
from vllm.model_executor.layers.quantization.utils.int4_cpu import INT4_GROUP_SIZES
from vllm.model_executor.layers.quantization.utils.quant_utils import unpack_from_int32

AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)


def awq_unpack(packed: torch.Tensor, cols: int) -> torch.Tensor:
    """int32 [rows, cols / 8] in AWQ's nibble order -> int32 [rows, cols] 0..15."""
    nibbles = unpack_from_int32(packed, 4, cols)
    order = torch.tensor(AWQ_REVERSE_ORDER)
    return nibbles.reshape(packed.shape[0], -1, 8)[..., order].reshape(packed.shape[0], cols)


class AWQConfig(CPUQuantizationConfig):
    """An AWQ checkpoint's `quantization_config` (or quant_config.json)."""

    def __init__(
        self,
        weight_bits: int,
        group_size: int,
        zero_point: bool,
        modules_to_not_convert: list[str] | None = None,
    ) -> None:
        super().__init__()
        if weight_bits != 4:
            raise ValueError(f"AWQ w_bit / bits={weight_bits} is not built here (built: 4).")
        if group_size not in INT4_GROUP_SIZES:
            raise ValueError(
                f"AWQ q_group_size / group_size={group_size} is not built here "
                f"(built: {INT4_GROUP_SIZES})."
            )
        if not zero_point:
            raise ValueError(
                "AWQ zero_point=false (symmetric, no qzeros) is not built here "
                "(built: zero_point=true)."
            )
        self.weight_bits = weight_bits
        self.group_size = group_size
        self.zero_point = zero_point
        self.modules_to_not_convert = modules_to_not_convert or []
        self.pack_factor = 32 // weight_bits

    def __repr__(self) -> str:
        return (
            f"AWQConfig(weight_bits={self.weight_bits}, group_size={self.group_size}, "
            f"zero_point={self.zero_point}, "
            f"modules_to_not_convert={self.modules_to_not_convert})"
        )

    def get_name(self) -> str:
        return "awq"

    @staticmethod
    def get_config_filenames() -> list[str]:
        return ["quant_config.json", "quantize_config.json"]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> AWQConfig:
        version = str(cls.get_from_keys_or(config, ["version"], "gemm")).lower()
        if version != "gemm":
            raise ValueError(
                f"AWQ version={version!r} is not built here (built: 'gemm', AutoAWQ's "
                "default layout)."
            )
        return cls(
            weight_bits=int(cls.get_from_keys(config, ["w_bit", "bits"])),
            group_size=int(cls.get_from_keys(config, ["q_group_size", "group_size"])),
            zero_point=bool(cls.get_from_keys(config, ["zero_point"])),
            modules_to_not_convert=cls.get_from_keys_or(config, ["modules_to_not_convert"], None),
        )

    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        skip = self.modules_to_not_convert
        return get_linear_quant_method(self, layer, prefix, AWQLinearMethod, skip=skip)


class AWQLinearMethod(Int4CPULinearMethod):
    """A linear layer's AWQ tensors ([in, out]-major, zeros packed like the
    weight), repacked for the CPU int4 kernel."""

    def create_linear_weights(self, layer: Any, spec: LinearWeightSpec) -> None:
        g, pf, k, n = self.int4_partition(layer, spec)
        packed = dict(input_dim=0, output_dim=1, packed_dim=1)
        int4_params(
            layer,
            spec.weight_loader,
            qweight=((k, n // pf), torch.int32, packed),
            qzeros=((k // g, n // pf), torch.int32, packed),
            scales=((k // g, n), spec.params_dtype, dict(input_dim=0, output_dim=1)),
            pack_factor=pf,
        )
        layer.input_size_per_partition = k

    def process_weights_after_loading(self, layer: Any) -> None:
        """u = q, zero = (8 - z) * s: the kernel's (u - 8) * s + zero is (q - z) * s."""
        n = layer.scales.shape[1]
        u = awq_unpack(layer.qweight.data, n).t().contiguous()  # [n, k]
        z = awq_unpack(layer.qzeros.data, n)  # [groups, n]
        s = layer.scales.data
        self.store_int4(layer, u, s.t(), ((8 - z).to(s.dtype) * s).t())
