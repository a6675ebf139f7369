"""W8A8-FP8: float8_e4m3fn weights and activations quantized to e4m3
(upstream: .../compressed_tensors/schemes/compressed_tensors_w8a8_fp8.py).

The checkpoint ("float-quantized", llm-compressor's FP8 / FP8_DYNAMIC /
FP8_BLOCK presets) holds, per linear
  weight        float8_e4m3fn [out, in]
  weight_scale  [out, 1] ("channel"), [1] or [] ("tensor"), or
                [ceil(out / bn), ceil(in / bk)] ("block")
  input_scale   [1] or [] (static activations only).
Activations, as upstream: dynamic -> one scale per token (max|x_row| / 448),
or per token and group of bk columns for block weights; static -> the
checkpoint's per-tensor input_scale (the largest of a fused layer's parts).
A fused layer's per-tensor weight parts are requantized to one scale (their
maximum), as upstream's per-tensor path does.
"""

from __future__ import annotations

from vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_scheme import (  # noqa: E501
    CompressedTensorsFp8Scheme,
)

__all__ = ["CompressedTensorsW8A8Fp8"]


class CompressedTensorsW8A8Fp8(CompressedTensorsFp8Scheme):
    """fp8 weights per tensor / channel / block, fp8 activations."""

    def __init__(
        self,
        strategy: str,
        is_static_input_scheme: bool,
        block_structure: list[int] | None = None,
    ) -> None:
        if is_static_input_scheme and block_structure is not None:
            raise ValueError("block-quantized fp8 weights take dynamic activations only.")
        act = "tensor" if is_static_input_scheme else ("group" if block_structure else "token")
        super().__init__(strategy, act, block=block_structure, requantize=True)
        self.is_static_input_scheme = is_static_input_scheme
