"""W8A16-FP8: float8_e4m3fn weights, activations left in the model dtype
(upstream: .../compressed_tensors/schemes/compressed_tensors_w8a16_fp8.py).

The checkpoint ("float-quantized" or "naive-quantized" format) holds, per linear
  weight        float8_e4m3fn [out, in]  (w = float(weight) * weight_scale)
  weight_scale  [out, 1] (strategy "channel"), [1] or [] ("tensor"), or
                [ceil(out / bn), ceil(in / bk)] ("block", block_structure [bn, bk]).
A fused layer's per-tensor parts keep their own scales, expanded to channels
(as upstream's weight-only path does); the weight stays fp8 in memory and is
multiplied by `ops.fp8_weight_gemm` (see utils/fp8_utils.py).
"""

from __future__ import annotations

from vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_scheme import (  # noqa: E501
    CompressedTensorsFp8Scheme,
)

__all__ = ["CompressedTensorsW8A16Fp8"]


class CompressedTensorsW8A16Fp8(CompressedTensorsFp8Scheme):
    """Weight-only fp8 per tensor, channel or block."""

    def __init__(self, strategy: str, block_structure: list[int] | None = None) -> None:
        super().__init__(strategy, act=None, block=block_structure)
