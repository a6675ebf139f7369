"""The per-layer schemes of compressed-tensors checkpoints
(upstream: .../compressed_tensors/schemes/__init__.py)."""

from vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_scheme import (  # noqa: E501
    CompressedTensorsScheme,
)
from vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_w8a8_fp8 import (  # noqa: E501
    CompressedTensorsW8A8Fp8,
)
from vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_w8a8_int8 import (  # noqa: E501
    CompressedTensorsW8A8Int8,
)
from vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_w8a16_fp8 import (  # noqa: E501
    CompressedTensorsW8A16Fp8,
)
from vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_wNa16 import (  # noqa: E501
    WNA16_SUPPORTED_BITS,
    CompressedTensorsWNA16,
)

__all__ = [
    "WNA16_SUPPORTED_BITS",
    "CompressedTensorsScheme",
    "CompressedTensorsW8A8Fp8",
    "CompressedTensorsW8A8Int8",
    "CompressedTensorsW8A16Fp8",
    "CompressedTensorsWNA16",
]
