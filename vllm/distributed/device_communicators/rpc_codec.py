"""msgpack encoding of executor RPC messages: method calls and their results.

The executor sends workers scheduler outputs, KV cache configs and the like,
and gets model runner outputs back. These are plain data (dataclasses,
NamedTuples, enums, msgspec structs, tensors), so instead of pickle each
value is turned into a msgpack tree in which objects are tagged maps:

    {"__t": "obj", "c": "vllm.v1.outputs:ModelRunnerOutput", "s": {field: value}}

Decoding rebuilds only classes that are (1) defined in a `vllm.` module (our
own code: such a module may be imported on first use, nothing else can be)
and (2) plain
data: a dataclass, NamedTuple, Enum or msgspec Struct. A dataclass's state is
set field by field without running its `__init__`; Enums, NamedTuples and
Structs go through their constructors. Tensors and arrays go through `MsgpackEncoder` (raw
buffers, out of band when large); dtypes are checked against allow-lists.
A map that has the tag key itself is escaped as a tagged list of pairs.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import re
import sys
from collections.abc import Sequence
from typing import Any, TypeVar

import msgspec
import numpy as np
import torch

from vllm.v1.serial_utils import TORCH_DTYPES, MsgpackDecoder, MsgpackEncoder, bytestr

_T = TypeVar("_T")

TAG = "__t"
# A dotted module path inside the vllm package (identifiers only).
_VLLM_MODULE = re.compile(r"vllm(\.[A-Za-z_][A-Za-z0-9_]*)+")


class RpcDecodeError(ValueError):
    """A message that is not a valid RPC value (bad tag, class not allowed, ...)."""


def _qualname(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _is_plain_data_class(cls: Any) -> bool:
    return isinstance(cls, type) and (
        dataclasses.is_dataclass(cls)
        or issubclass(cls, (enum.Enum, msgspec.Struct))
        or (issubclass(cls, tuple) and hasattr(cls, "_fields"))
    )


def _resolve_class(name: Any) -> type:
    """The class `module:Qual.Name`, if it is allowed (see module docstring)."""
    if not isinstance(name, str) or ":" not in name:
        raise RpcDecodeError(f"Bad class reference {name!r}")
    module_name, _, qualname = name.partition(":")
    if not _VLLM_MODULE.fullmatch(module_name):
        raise RpcDecodeError(f"Class {name!r} is not from a vllm module")
    module = sys.modules.get(module_name)
    if module is None:
        try:  # one of our own modules, not yet imported in this process
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise RpcDecodeError(f"No module for class {name!r}") from e
    obj: Any = module
    for part in qualname.split("."):
        # No dunder hops (__class__, __globals__, ...): module attributes only.
        obj = None if part.startswith("__") else getattr(obj, part, None)
        if obj is None:
            raise RpcDecodeError(f"No class {name!r}")
    if not _is_plain_data_class(obj):
        raise RpcDecodeError(f"{name!r} is not a plain data class")
    return obj


# ---- encoding ----------------------------------------------------------------------------
def to_tree(obj: Any) -> Any:
    """`obj` as msgpack-native values, tensors and tagged maps."""
    if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        return obj
    if isinstance(obj, enum.Enum):
        return {TAG: "enum", "c": _qualname(type(obj)), "v": obj.value}
    if isinstance(obj, (bytearray, memoryview)):
        return bytes(obj)
    if isinstance(obj, list):
        return [to_tree(v) for v in obj]
    if isinstance(obj, dict):
        if all(isinstance(k, (str, int)) and k != TAG for k in obj):
            return {k: to_tree(v) for k, v in obj.items()}
        return {TAG: "dict", "v": [[to_tree(k), to_tree(v)] for k, v in obj.items()]}
    if isinstance(obj, tuple) and hasattr(type(obj), "_fields"):
        return {TAG: "nt", "c": _qualname(type(obj)), "v": [to_tree(v) for v in obj]}
    if isinstance(obj, tuple):
        return {TAG: "tuple", "v": [to_tree(v) for v in obj]}
    if isinstance(obj, (set, frozenset)):
        return {TAG: "set" if isinstance(obj, set) else "fset", "v": [to_tree(v) for v in obj]}
    if isinstance(obj, torch.Tensor):
        return {TAG: "tensor", "v": obj}
    if isinstance(obj, np.ndarray):
        return {TAG: "ndarray", "v": obj}
    if isinstance(obj, torch.dtype):
        return {TAG: "dtype", "v": str(obj).removeprefix("torch.")}
    if isinstance(obj, torch.device):
        return {TAG: "device", "v": str(obj)}
    if _is_plain_data_class(type(obj)):
        return {TAG: "obj", "c": _qualname(type(obj)), "s": _state(obj)}
    raise TypeError(f"Cannot send a {type(obj).__name__} over RPC (plain data only).")


def _state(obj: Any) -> dict[str, Any]:
    if isinstance(obj, msgspec.Struct):
        state = {f: getattr(obj, f) for f in obj.__struct_fields__}
        state.update(getattr(obj, "__dict__", {}))  # dict=True structs' extra attributes
    elif hasattr(obj, "__dict__"):
        state = dict(vars(obj))
    else:
        state = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return {k: to_tree(v) for k, v in state.items()}


# ---- decoding ----------------------------------------------------------------------------
class RpcDecoder(MsgpackDecoder):
    """Decodes frames made by `RpcEncoder` back into Python values."""

    def __init__(self) -> None:
        super().__init__(None, share_mem=False)

    def decode(self, bufs: bytestr | Sequence[bytestr]) -> Any:
        if isinstance(bufs, (bytes, bytearray, memoryview)):
            bufs = [bufs]
        self.aux_buffers = bufs
        try:
            return self._from_tree(self.decoder.decode(bufs[0]))
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise RpcDecodeError(f"Invalid RPC message: {e}") from e
        finally:
            self.aux_buffers = ()

    def _from_tree(self, t: Any) -> Any:
        if isinstance(t, list):
            return [self._from_tree(v) for v in t]
        if isinstance(t, memoryview):
            return bytes(t)
        if not isinstance(t, dict):
            return t
        kind = t.get(TAG)
        if kind is None:
            return {k: self._from_tree(v) for k, v in t.items()}
        return self._from_tagged(kind, t)

    def _from_tagged(self, kind: Any, t: dict[str, Any]) -> Any:
        v = t.get("v")
        if kind == "tuple":
            return tuple(self._from_tree(x) for x in _tagged_list(kind, v))
        if kind in ("set", "fset"):
            items = (self._from_tree(x) for x in _tagged_list(kind, v))
            return set(items) if kind == "set" else frozenset(items)
        if kind == "dict":
            return {self._from_tree(k): self._from_tree(x) for k, x in _tagged_pairs(v)}
        if kind == "tensor":
            return self._decode_tensor(v)
        if kind == "ndarray":
            return self._decode_ndarray(v)
        if kind == "dtype":
            if v not in TORCH_DTYPES:
                raise RpcDecodeError(f"dtype {v!r} is not allowed")
            return TORCH_DTYPES[v]
        if kind == "device":
            return torch.device(str(v))
        if kind == "enum":
            return _construct(_resolve_class(t.get("c")), v)
        if kind == "nt":
            cls = _resolve_class(t.get("c"))
            return _construct(cls, *(self._from_tree(x) for x in _tagged_list(kind, v)))
        if kind == "obj":
            return self._build_object(_resolve_class(t.get("c")), t.get("s"))
        raise RpcDecodeError(f"Unknown tag {kind!r}")

    def _build_object(self, cls: type, state: Any) -> Any:
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise RpcDecodeError(f"Bad state for {cls.__name__}")
        values = {k: self._from_tree(v) for k, v in state.items()}
        if issubclass(cls, msgspec.Struct):
            # Structs cannot be created empty: fields through the constructor
            # (its validation runs), extra attributes afterwards.
            fields = set(cls.__struct_fields__)
            struct = _construct(cls, **{k: v for k, v in values.items() if k in fields})
            for key, value in values.items():
                if key not in fields:
                    object.__setattr__(struct, key, value)
            return struct
        obj = cls.__new__(cls)
        for key, value in values.items():
            # object.__setattr__: frozen dataclasses included; no __init__ runs.
            object.__setattr__(obj, key, value)
        return obj


def _construct(cls: type[_T], *args: Any, **kwargs: Any) -> _T:
    """`cls(*args, **kwargs)`; the constructor's refusal of the values (a
    bad enum value, a missing field, a Struct's validation) is a bad message."""
    try:
        return cls(*args, **kwargs)
    except (TypeError, ValueError) as e:
        raise RpcDecodeError(f"Cannot build {cls.__name__}: {e}") from e


def _tagged_list(kind: Any, v: Any) -> list[Any]:
    """The items of a tagged sequence ("tuple", "set", "fset", "nt")."""
    if not isinstance(v, list):
        raise RpcDecodeError(f"Tag {kind!r} needs a list of items, not {type(v).__name__}")
    return v


def _tagged_pairs(v: Any) -> list[Any]:
    """The [key, value] pairs of a tagged "dict" (an escaped map)."""
    pairs = _tagged_list("dict", v)
    if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        raise RpcDecodeError("Tag 'dict' needs [key, value] pairs")
    return pairs


class RpcEncoder:
    """Encodes any RPC value into frames: [msgpack body, *raw buffers]."""

    def __init__(self) -> None:
        self.encoder = MsgpackEncoder()

    def encode(self, obj: Any) -> Sequence[bytestr]:
        return self.encoder.encode(to_tree(obj))
