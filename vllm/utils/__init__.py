"""Small shared helpers (upstream: vllm/utils/)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

# Re-exported: upstream defines them in vllm/utils/mem_constants.py.
from vllm.utils.mem_constants import GiB_bytes as GiB_bytes
from vllm.utils.mem_constants import MiB_bytes as MiB_bytes

if TYPE_CHECKING:
    import torch

    STR_DTYPE_TO_TORCH_DTYPE: dict[str, torch.dtype]

T = TypeVar("T")


def __getattr__(name: str) -> Any:
    # torch is imported on first use, not with the package: the `vllm` command
    # imports vllm.utils.system_utils before anything else (to pre-start the
    # engine's process), and torch's import is ~2 s of a 2-core machine.
    if name == "STR_DTYPE_TO_TORCH_DTYPE":
        import torch

        table = {"half": torch.float16, "float16": torch.float16, "bfloat16": torch.bfloat16}
        table |= {"float": torch.float32, "float32": torch.float32}
        table |= {"fp8": torch.uint8, "fp8_e4m3": torch.uint8, "fp8_e5m2": torch.uint8}
        globals()[name] = table
        return table
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def cdiv(a: int, b: int) -> int:
    """Ceiling division."""
    return -(a // -b)


def round_up(x: int, multiple: int) -> int:
    return cdiv(x, multiple) * multiple


def round_down(x: int, multiple: int) -> int:
    return (x // multiple) * multiple


def get_dtype_size(dtype: torch.dtype) -> int:
    """Size of one element of `dtype` in bytes."""
    import torch

    return torch.tensor([], dtype=dtype).element_size()


def random_uuid() -> str:
    return uuid.uuid4().hex


def is_pin_memory_available() -> bool:
    import torch

    return torch.cuda.is_available()


class ConstantList(Generic[T], Sequence):
    """A read-only view of a list: the request hands these out so that callers
    cannot mutate its token lists behind its back."""

    __slots__ = ("_x",)

    def __init__(self, x: list[T]) -> None:
        self._x = x

    @overload
    def __getitem__(self, item: int) -> T: ...

    @overload
    def __getitem__(self, s: slice) -> list[T]: ...

    def __getitem__(self, item):
        return self._x[item]

    def __len__(self) -> int:
        return len(self._x)

    def __iter__(self) -> Iterator[T]:
        return iter(self._x)

    def __contains__(self, item) -> bool:
        return item in self._x

    def __eq__(self, other) -> bool:
        if isinstance(other, ConstantList):
            return self._x == other._x
        return self._x == other

    def index(self, item, start: int = 0, stop: int | None = None) -> int:
        return self._x.index(item, start, len(self._x) if stop is None else stop)

    def copy(self) -> list[T]:
        return list(self._x)

    def __repr__(self) -> str:
        return f"ConstantList({self._x})"

    def _mutation(self, *args, **kwargs):
        raise TypeError("Cannot modify a ConstantList")

    append = extend = insert = remove = pop = clear = __setitem__ = __delitem__ = _mutation
