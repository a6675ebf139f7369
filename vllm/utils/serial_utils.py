"""Tensors as raw bytes, for the pooling routes' `base64` / `bytes`
encodings (upstream: vllm/utils/serial_utils.py).

A tensor is written as its values in row-major order, each `embed_dtype`
value as its own bytes (float32 4, float16 / bfloat16 2, fp8 1), in the byte
order `endianness` names ("native": this machine's). bfloat16 and the fp8
kinds have no numpy dtype: their bytes are viewed as float16 / uint8 to be
written, and read back the same way.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt
import torch

sys_byteorder = sys.byteorder

EmbedDType = Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"]
Endianness = Literal["native", "big", "little"]
EncodingFormat = Literal["float", "base64", "bytes", "bytes_only"]


@dataclass(frozen=True)
class DTypeInfo:
    # The dtype the values are cast to; the same-width dtype its bytes are
    # viewed as to reach numpy (torch and numpy).
    torch_dtype: torch.dtype
    torch_view_dtype: torch.dtype
    numpy_view_dtype: npt.DTypeLike

    @property
    def nbytes(self) -> int:
        return self.torch_dtype.itemsize


EMBED_DTYPES: Mapping[EmbedDType, DTypeInfo] = {
    "float32": DTypeInfo(torch.float32, torch.float32, np.float32),
    "float16": DTypeInfo(torch.float16, torch.float16, np.float16),
    "bfloat16": DTypeInfo(torch.bfloat16, torch.float16, np.float16),
    "fp8_e4m3": DTypeInfo(torch.float8_e4m3fn, torch.uint8, np.uint8),
    "fp8_e5m2": DTypeInfo(torch.float8_e5m2, torch.uint8, np.uint8),
}
ENDIANNESS: tuple[Endianness, ...] = get_args(Endianness)


def _swaps(endianness: Endianness) -> bool:
    return endianness != "native" and endianness != sys_byteorder


def tensor2binary(tensor: torch.Tensor, embed_dtype: EmbedDType, endianness: Endianness) -> bytes:
    """The tensor's values (flattened) as `embed_dtype` bytes in `endianness` order."""
    info = EMBED_DTYPES[embed_dtype]
    flat = tensor.detach().to("cpu", info.torch_dtype).flatten().contiguous()
    array = flat.view(info.torch_view_dtype).numpy()
    if _swaps(endianness):
        array = array.byteswap()
    return array.tobytes()


def binary2tensor(
    binary: bytes, shape: tuple[int, ...], embed_dtype: EmbedDType, endianness: Endianness
) -> torch.Tensor:
    """The inverse of tensor2binary (a tensor of `embed_dtype`, `shape`)."""
    info = EMBED_DTYPES[embed_dtype]
    array = np.frombuffer(binary, dtype=info.numpy_view_dtype).reshape(shape)
    if _swaps(endianness):
        array = array.byteswap()
    return torch.from_numpy(array.copy()).view(info.torch_dtype)
