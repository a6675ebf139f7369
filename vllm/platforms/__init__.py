"""`current_platform`: the device this process runs on (upstream:
vllm/platforms/__init__.py). Resolved lazily on first access so that importing
vllm does not initialise CUDA."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from vllm.platforms.interface import Platform, PlatformEnum, UnspecifiedPlatform

_current_platform: Platform | None = None

if TYPE_CHECKING:
    # What the module __getattr__ below returns, for the type checker.
    current_platform: Platform


def _resolve_current_platform() -> Platform:
    if torch.cuda.is_available():
        from vllm.platforms.cuda import CudaPlatform

        return CudaPlatform()
    from vllm.platforms.cpu import CpuPlatform

    return CpuPlatform()


def __getattr__(name: str) -> Any:
    global _current_platform
    if name == "current_platform":
        if _current_platform is None:
            _current_platform = _resolve_current_platform()
        return _current_platform
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Platform", "PlatformEnum", "UnspecifiedPlatform", "current_platform"]
