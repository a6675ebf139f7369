"""Weight-only int8 / int4 (W8A16, W4A16) in compressed-tensors' pack-quantized
format (upstream: .../compressed_tensors/schemes/compressed_tensors_wNa16.py).

The checkpoint holds, per linear (llm-compressor's names):
  weight_packed  int32 [out, in * bits / 32]: each int32 holds 32/bits values,
                 value j of a word in bits [j*bits, (j+1)*bits), offset-coded
                 (stored = q + 2**(bits-1), q the signed quantized value);
  weight_scale   [out, in / group_size] (strategy "group") or [out, 1] ("channel");
  weight_shape   int [2]: the dense [out, in] (read, not needed: the layer knows it).
  weight_zero_point (asymmetric only) int32 [out * bits / 32, in / group_size]:
                 the signed zero points, offset-coded and packed along the OUTPUT dim.
The dense weight is w = (q - zp) * scale (compressed-tensors' dequantize; zp = 0
when symmetric).

Once loaded the weights are repacked for torch's CPU weight-only kernels and
stay low-bit in memory:
  8 bits, per channel: int8 [out, in] and scales [out] for
    `aten._weight_int8pack_mm(x, w_int8, scales)` = x @ (w_int8 * scales[:, None]).T;
  4 bits, per group: utils/int4_cpu.py's `pack_int4_cpu` of the unsigned
    values (0..15) and scale/zero pairs for `int4_cpu_linear`
    (`aten._weight_int4pack_mm_for_cpu`), which computes w = (u - 8) * scale + zero;
    with u = q + 8 (the same offset code as the checkpoint) and zero = -zp * scale
    this is (q - zp) * scale. A float32 model stores them as int8 groups for
    `int8_group_gemm` instead (that kernel is ~100x slower with float32 x).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.parameter import Parameter

from vllm.model_executor.layers.linear import LinearWeightSpec
from vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_scheme import (  # noqa: E501
    CompressedTensorsScheme,
)
from vllm.model_executor.layers.quantization.utils.int4_cpu import (
    INT4_GROUP_SIZES,
    int4_cpu_linear,
    pack_int4_cpu,
)
from vllm.model_executor.layers.quantization.utils.quant_utils import unpack_from_int32
from vllm.model_executor.utils import set_weight_attrs

__all__ = ["INT4_GROUP_SIZES", "CompressedTensorsWNA16", "unpack_from_int32"]

# bits -> the strategies whose CPU kernel is built.
WNA16_SUPPORTED_BITS: dict[int, tuple[str, ...]] = {8: ("channel",), 4: ("group",)}


def _ignore_loader(param: Parameter, loaded_weight: torch.Tensor, *args: Any) -> None:
    """weight_shape: checked for size only (fused layers receive one per shard)."""
    if loaded_weight.numel() != param.numel():
        raise ValueError(f"weight_shape has {loaded_weight.numel()} entries, expected 2.")


class CompressedTensorsWNA16(CompressedTensorsScheme):
    """W{4,8}A16: symmetric int weights, activations in the model dtype.
    `layer` is typed Any: the attributes read are those `create_weights` set."""

    def __init__(
        self,
        strategy: str,
        num_bits: int,
        group_size: int | None = None,
        symmetric: bool = True,
    ) -> None:
        if strategy not in WNA16_SUPPORTED_BITS.get(num_bits, ()):
            raise ValueError(
                f"compressed-tensors W{num_bits}A16 with strategy {strategy!r} is not built "
                f"(built: W8A16 per channel, W4A16 per group of {INT4_GROUP_SIZES})."
            )
        if strategy == "group" and group_size not in INT4_GROUP_SIZES:
            raise ValueError(
                f"compressed-tensors W4A16 group_size={group_size} is not built "
                f"(built: {INT4_GROUP_SIZES})."
            )
        if not symmetric and num_bits != 4:
            raise ValueError(
                f"compressed-tensors W{num_bits}A16 with asymmetric weights is not built "
                "(built: asymmetric W4A16 per group)."
            )
        self.symmetric = symmetric
        self.strategy = strategy
        self.num_bits = num_bits
        self.pack_factor = 32 // num_bits
        self.group_size = group_size

    def create_linear_weights(self, layer: Any, spec: LinearWeightSpec) -> None:
        out, weight_loader = spec.output_size_per_partition, spec.weight_loader
        k = spec.input_size_per_partition
        if k % self.pack_factor or (self.group_size and k % self.group_size):
            raise ValueError(
                f"{getattr(layer, 'prefix', 'layer')}: input size {k} per rank does not divide "
                f"into whole int32 words / groups (bits={self.num_bits}, "
                f"group_size={self.group_size}); choose another tensor-parallel size."
            )
        # Row-parallel layers split the input dim; the per-channel scale is then whole.
        split_input = k != spec.input_size
        packed = Parameter(
            torch.empty(out, k // self.pack_factor, dtype=torch.int32), requires_grad=False
        )
        set_weight_attrs(
            packed,
            {
                "weight_loader": weight_loader,
                "output_dim": 0,
                "input_dim": 1,
                "packed_dim": 1,
                "pack_factor": self.pack_factor,
            },
        )
        scale_cols = k // self.group_size if self.group_size else 1
        scale = Parameter(
            torch.empty(out, scale_cols, dtype=spec.params_dtype), requires_grad=False
        )
        grouped_and_split = self.group_size is not None and split_input
        set_weight_attrs(
            scale,
            {
                "weight_loader": weight_loader,
                "output_dim": 0,
                "input_dim": 1 if grouped_and_split else None,
            },
        )
        shape = Parameter(torch.empty(2, dtype=torch.int64), requires_grad=False)
        set_weight_attrs(shape, {"weight_loader": _ignore_loader})
        layer.register_parameter("weight_packed", packed)
        layer.register_parameter("weight_scale", scale)
        layer.register_parameter("weight_shape", shape)
        if not self.symmetric:
            # Zero points: pack_factor output rows per int32, packed along dim 0.
            zero = Parameter(
                torch.empty(out // self.pack_factor, scale_cols, dtype=torch.int32),
                requires_grad=False,
            )
            set_weight_attrs(
                zero,
                {
                    "weight_loader": weight_loader,
                    "output_dim": 0,
                    "input_dim": 1 if grouped_and_split else None,
                    "packed_dim": 0,
                    "pack_factor": self.pack_factor,
                },
            )
            layer.register_parameter("weight_zero_point", zero)
        layer.input_size_per_partition = k

    def process_weights_after_loading(self, layer: Any) -> None:
        """Repack for the CPU kernel (see the module docstring)."""
        k = layer.input_size_per_partition
        values = unpack_from_int32(layer.weight_packed.data, self.num_bits, k)
        scale = layer.weight_scale.data
        del layer.weight_shape
        if self.num_bits == 8:
            w_int8 = (values - 128).to(torch.int8).contiguous()
            layer.weight_packed = Parameter(w_int8, requires_grad=False)
            layer.weight_scale = Parameter(scale[:, 0].contiguous(), requires_grad=False)
            return
        zero = torch.zeros_like(scale)
        if not self.symmetric:
            # w = (q - zp) * scale = q * scale + zero with zero = -zp * scale.
            packed_zp = layer.weight_zero_point.data
            zp = unpack_from_int32(packed_zp.t().contiguous(), self.num_bits, scale.shape[0]).t()
            zero = -(zp - (1 << (self.num_bits - 1))).to(scale.dtype) * scale
            del layer.weight_zero_point
        w_int4, scale_and_zero = pack_int4_cpu(values, scale, zero)
        layer.weight_packed = Parameter(w_int4, requires_grad=False)
        layer.weight_scale = Parameter(scale_and_zero, requires_grad=False)

    def apply_weights(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., in] -> [..., out] (+ bias), in x's dtype."""
        if self.num_bits == 4:
            assert self.group_size is not None
            return int4_cpu_linear(
                x, layer.weight_packed, layer.weight_scale, self.group_size, bias
            )
        x2d = x.reshape(-1, x.shape[-1])
        scale = layer.weight_scale.to(x.dtype)
        out = torch.ops.aten._weight_int8pack_mm(x2d, layer.weight_packed, scale)
        if bias is not None:
            out = out + bias
        return out.reshape(*x.shape[:-1], out.shape[-1])
