"""W8A8 int8: int8 weights per output channel, activations quantized to int8
per token at run time (upstream: .../schemes/compressed_tensors_w8a8_int8.py).

The checkpoint ("int-quantized" format, as llm-compressor writes W8A8) holds
  weight        int8 [out, in] (q, symmetric: w = q * weight_scale)
  weight_scale  [out, 1]
and the config asks for dynamic, symmetric, per-token input activations.
Each call quantizes x row by row (s_x = max|x_row| / 127, x_q = round(x / s_x),
compressed-tensors' symmetric quantization), multiplies int8 x int8 -> int32
with `torch._int_mm` (exact), and rescales: y = acc * s_x * s_w[None, :].
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.parameter import Parameter

from vllm.model_executor.layers.linear import LinearWeightSpec
from vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_scheme import (  # noqa: E501
    CompressedTensorsScheme,
)
from vllm.model_executor.utils import set_weight_attrs


def per_token_quant_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] float -> (int8 [M, K], float32 scales [M, 1]); symmetric."""
    xf = x.float()
    scale = (xf.abs().amax(dim=-1, keepdim=True) / 127.0).clamp(min=1e-10)
    return torch.round(xf / scale).clamp(-128, 127).to(torch.int8), scale


class CompressedTensorsW8A8Int8(CompressedTensorsScheme):
    """int8 x int8 GEMM with per-channel weight and per-token activation scales.
    `layer` is typed Any: the attributes read are those `create_weights` set."""

    def create_linear_weights(self, layer: Any, spec: LinearWeightSpec) -> None:
        out, weight_loader = spec.output_size_per_partition, spec.weight_loader
        weight = Parameter(
            torch.empty(out, spec.input_size_per_partition, dtype=torch.int8), requires_grad=False
        )
        set_weight_attrs(weight, {"weight_loader": weight_loader, "output_dim": 0, "input_dim": 1})
        # Scales are kept in float32 whatever the model dtype (they are tiny).
        scale = Parameter(torch.empty(out, 1, dtype=torch.float32), requires_grad=False)
        set_weight_attrs(scale, {"weight_loader": weight_loader, "output_dim": 0})
        layer.register_parameter("weight", weight)
        layer.register_parameter("weight_scale", scale)

    def process_weights_after_loading(self, layer: Any) -> None:
        """The weight as [in, out] for `_int_mm`, the scales as a row [out]."""
        layer.weight = Parameter(layer.weight.data.t().contiguous(), requires_grad=False)
        layer.weight_scale = Parameter(
            layer.weight_scale.data[:, 0].contiguous(), requires_grad=False
        )

    def apply_weights(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x2d = x.reshape(-1, x.shape[-1])
        x_q, x_scale = per_token_quant_int8(x2d)
        acc = torch._int_mm(x_q, layer.weight)
        out = (acc.float() * x_scale * layer.weight_scale).to(x.dtype)
        if bias is not None:
            out = out + bias
        return out.reshape(*x.shape[:-1], out.shape[-1])
