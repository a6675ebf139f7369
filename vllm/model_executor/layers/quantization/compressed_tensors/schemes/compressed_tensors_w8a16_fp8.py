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

from typing import Any

import torch

from vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_scheme import (  # noqa: E501
    CompressedTensorsScheme,
)
from vllm.model_executor.layers.quantization.utils.fp8_utils import Fp8WeightLayout

__all__ = ["CompressedTensorsW8A16Fp8"]


class CompressedTensorsW8A16Fp8(CompressedTensorsScheme):
    """Weight-only fp8 per tensor, channel or block."""

    def __init__(self, strategy: str, block_structure: list[int] | None = None) -> None:
        self.strategy = strategy
        self.layout = Fp8WeightLayout(strategy, act=None, block=block_structure)

    @classmethod
    def get_min_capability(cls) -> int:
        return -1  # CPU kernels only

    def create_weights(
        self,
        layer: Any,
        output_partition_sizes: list[int],
        input_size_per_partition: int,
        params_dtype: torch.dtype,
        weight_loader: Any,
        **kwargs: Any,
    ) -> None:
        self.layout.create(layer, output_partition_sizes, input_size_per_partition, weight_loader)

    def process_weights_after_loading(self, layer: Any) -> None:
        self.layout.process(layer)

    def apply_weights(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return self.layout.apply(layer, x, bias)
