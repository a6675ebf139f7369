"""Triton, when installed (upstream: vllm/triton_utils/).

`HAS_TRITON` says whether `triton` imports. Kernels are decorated with
`triton.jit` at import time and launched only on CUDA tensors, so a CPU-only
install imports them without compiling any. Under `TRITON_INTERPRET=1` (read
by `triton.jit` when a kernel is *decorated*, i.e. when its module is
imported) the same kernels run on CPU tensors in Triton's numpy interpreter,
which is how the tests compare them with the torch paths.
"""

from __future__ import annotations

from typing import Any

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAS_TRITON = False

    class _UnavailableKernel:
        """What `@triton.jit` gives without Triton: importable, not launchable."""

        def __init__(self, fn: Any) -> None:
            self.fn = fn

        def __getitem__(self, grid: Any) -> Any:
            raise RuntimeError(f"Triton is not installed; cannot launch {self.fn.__name__}.")

    class _TritonPlaceholder:
        @staticmethod
        def jit(fn: Any = None, **kwargs: Any) -> Any:
            return _UnavailableKernel(fn) if fn is not None else _UnavailableKernel

        @staticmethod
        def next_power_of_2(n: int) -> int:
            return 1 << (max(n, 1) - 1).bit_length()

        @staticmethod
        def cdiv(a: int, b: int) -> int:
            return -(a // -b)

    class _LanguagePlaceholder:
        """Annotations such as `tl.constexpr` must resolve at import time."""

        constexpr = Any

    triton = _TritonPlaceholder()  # type: ignore[assignment]
    tl = _LanguagePlaceholder()  # type: ignore[assignment]

__all__ = ["HAS_TRITON", "tl", "triton"]
