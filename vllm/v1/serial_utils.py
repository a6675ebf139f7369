"""msgpack encoding of the engine's messages (upstream: vllm/v1/serial_utils.py).

Everything that crosses the ZMQ sockets between the front end and the engine
core goes through these two classes. Design rules:

* Decoding is typed: a decoder is built for one type (`EngineCoreRequest`,
  `EngineCoreOutputs`, ...) and msgspec validates the message against it.
* Nothing is ever unpickled. A tensor or numpy array is sent as
  `[dtype name, shape, data]`, where the dtype name must be in an allow-list
  and `data` is either the raw bytes inline (small arrays, msgpack ext type
  `CUSTOM_TYPE_RAW_VIEW`) or the index of an extra ZMQ frame that carries the
  raw buffer out of band (large arrays: no copy into the msgpack body).
* A message is therefore a sequence of frames: frame 0 is the msgpack body,
  frames 1.. are the out-of-band buffers it refers to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
import torch

from vllm.v1.engine import UtilityResult

bytestr = bytes | bytearray | memoryview

# Ext type of an inline raw buffer (upstream's number; 1 and 2 were pickle
# and cloudpickle there, and are deliberately not implemented here).
CUSTOM_TYPE_RAW_VIEW = 3

# Arrays at least this large (bytes) travel as separate frames.
DEFAULT_SIZE_THRESHOLD = 256

# The only dtypes a message may name: decoding never looks a name up in the
# torch or numpy namespace.
TORCH_DTYPES: dict[str, torch.dtype] = {
    str(dt).removeprefix("torch."): dt
    for dt in (
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.int8,
        torch.uint8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.bool,
    )
}
_NUMPY_DTYPES: frozenset[str] = frozenset(
    ("float16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")
)


class MsgpackEncoder:
    """Encodes a message into frames: the msgpack body, then raw buffers.

    Not thread-safe: one encoder per thread.
    """

    def __init__(self, size_threshold: int | None = None) -> None:
        self.size_threshold = DEFAULT_SIZE_THRESHOLD if size_threshold is None else size_threshold
        self.encoder = msgspec.msgpack.Encoder(enc_hook=self.enc_hook)
        # Out-of-band buffers of the message being encoded (index 0 is the body).
        self.aux_buffers: list[bytestr] | None = None

    def encode(self, obj: Any) -> Sequence[bytestr]:
        """Frames of `obj`: `[body, *out_of_band_buffers]`."""
        try:
            bufs: list[bytestr] = [b""]
            self.aux_buffers = bufs
            bufs[0] = self.encoder.encode(obj)
            return bufs
        finally:
            self.aux_buffers = None

    def encode_into(self, obj: Any, buf: bytearray) -> Sequence[bytestr]:
        """Like `encode`, writing the body into `buf` (reused between messages)."""
        try:
            self.aux_buffers = [buf]
            bufs = self.aux_buffers
            self.encoder.encode_into(obj, buf)
            return bufs
        finally:
            self.aux_buffers = None

    def enc_hook(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return self._encode_tensor(obj)
        if isinstance(obj, np.ndarray) and obj.dtype.kind not in ("O", "V"):
            return self._encode_ndarray(obj)
        if isinstance(obj, UtilityResult):
            # The result of a utility call must itself be msgpack-encodable
            # (plain values, lists, dicts, tensors); it is decoded untyped.
            return obj.result
        if isinstance(obj, (set, frozenset)):
            return list(obj)
        raise TypeError(
            f"Object of type {type(obj).__name__} is not serializable "
            "(no pickle fallback by design)"
        )

    def _encode_tensor(self, t: torch.Tensor) -> Any:
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in TORCH_DTYPES:
            raise TypeError(f"Tensors of dtype {dtype} cannot be serialized")
        t = t.detach().cpu().contiguous()
        # bfloat16 has no numpy twin: ship raw bytes, reinterpret on the far side.
        raw = t.flatten().view(torch.uint8).numpy() if t.numel() else np.empty(0, np.uint8)
        return dtype, tuple(t.shape), self._encode_buffer(raw.data)

    def _encode_ndarray(self, a: np.ndarray) -> Any:
        dtype = a.dtype.name
        if dtype not in _NUMPY_DTYPES:
            raise TypeError(f"Arrays of dtype {dtype} cannot be serialized")
        a = np.ascontiguousarray(a)
        return dtype, a.shape, self._encode_buffer(a.data)

    def _encode_buffer(self, data: memoryview) -> Any:
        assert self.aux_buffers is not None
        data = data.cast("B")
        if len(data) < self.size_threshold:
            return msgspec.msgpack.Ext(CUSTOM_TYPE_RAW_VIEW, data.tobytes())
        self.aux_buffers.append(data)
        return len(self.aux_buffers) - 1


class MsgpackDecoder:
    """Decodes frames made by `MsgpackEncoder` into an instance of type `t`.

    Raises `msgspec.DecodeError` / `msgspec.ValidationError` for anything
    that is not a valid message of that type (a pickle payload included).
    """

    def __init__(self, t: Any = None, share_mem: bool = True) -> None:
        self.share_mem = share_mem
        args = () if t is None else (t,)
        self.decoder = msgspec.msgpack.Decoder(
            *args, ext_hook=self.ext_hook, dec_hook=self.dec_hook
        )
        self.aux_buffers: Sequence[bytestr] = ()

    def decode(self, bufs: bytestr | Sequence[bytestr]) -> Any:
        if isinstance(bufs, (bytes, bytearray, memoryview)):
            return self.decoder.decode(bufs)
        self.aux_buffers = bufs
        try:
            return self.decoder.decode(bufs[0])
        finally:
            self.aux_buffers = ()

    def dec_hook(self, t: type, obj: Any) -> Any:
        if t is torch.Tensor:
            return self._decode_tensor(obj)
        if t is np.ndarray:
            return self._decode_ndarray(obj)
        raise msgspec.ValidationError(f"Unsupported type in message: {t!r}")

    def ext_hook(self, code: int, data: memoryview) -> Any:
        if code == CUSTOM_TYPE_RAW_VIEW:
            return data
        raise msgspec.ValidationError(f"Unsupported msgpack extension type {code}")

    def _parts(self, obj: Any) -> tuple[str, tuple[int, ...], memoryview]:
        if not (isinstance(obj, (list, tuple)) and len(obj) == 3):
            raise msgspec.ValidationError("An array is [dtype, shape, data]")
        dtype, shape, data = obj
        if not (
            isinstance(shape, (list, tuple)) and all(isinstance(s, int) and s >= 0 for s in shape)
        ):
            raise msgspec.ValidationError(f"Bad array shape {shape!r}")
        if isinstance(data, int):
            if not 0 < data < len(self.aux_buffers):
                raise msgspec.ValidationError(f"Array refers to missing frame {data}")
            data = self.aux_buffers[data]
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise msgspec.ValidationError("Array data must be raw bytes")
        return dtype, tuple(shape), memoryview(data).cast("B")

    def _decode_ndarray(self, obj: Any) -> np.ndarray:
        dtype, shape, data = self._parts(obj)
        if dtype not in _NUMPY_DTYPES:
            raise msgspec.ValidationError(f"Array dtype {dtype!r} is not allowed")
        arr = np.frombuffer(data, dtype=np.dtype(dtype))
        if not self.share_mem:
            arr = arr.copy()
        return arr.reshape(shape)

    def _decode_tensor(self, obj: Any) -> torch.Tensor:
        dtype, shape, data = self._parts(obj)
        torch_dtype = TORCH_DTYPES.get(dtype) if isinstance(dtype, str) else None
        if torch_dtype is None:
            raise msgspec.ValidationError(f"Tensor dtype {dtype!r} is not allowed")
        numel = 1
        for s in shape:
            numel *= s
        if len(data) != numel * torch_dtype.itemsize:
            raise msgspec.ValidationError("Tensor data does not match its shape and dtype")
        if numel == 0:
            return torch.empty(shape, dtype=torch_dtype)
        # torch.frombuffer wants a writable buffer; the frame may be read-only.
        buf = bytearray(data) if (data.readonly or not self.share_mem) else data
        return torch.frombuffer(buf, dtype=torch.uint8).view(torch_dtype).view(shape)
