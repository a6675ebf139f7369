"""Compilation and CUDA graph configuration (upstream: vllm/config/compilation.py)."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from vllm.logger import init_logger

logger = init_logger(__name__)


class CompilationMode(enum.IntEnum):
    NONE = 0
    STOCK_TORCH_COMPILE = 1
    DYNAMO_TRACE_ONCE = 2
    VLLM_COMPILE = 3


class CUDAGraphMode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = (FULL, NONE)
    FULL_AND_PIECEWISE = (FULL, PIECEWISE)


def default_capture_sizes(max_size: int = 512) -> list[int]:
    """1, 2, 4, then every 8 below 256, then every 16 up to max_size."""
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max_size + 1, 16))
    return [s for s in sizes if s <= max_size]


@dataclass
class CompilationConfig:
    mode: CompilationMode = CompilationMode.NONE
    cudagraph_mode: CUDAGraphMode | None = None
    cudagraph_capture_sizes: list[int] | None = None
    # Layer prefix -> layer module (attention layers register themselves).
    static_forward_context: dict[str, Any] = field(default_factory=dict, repr=False,
                                                   compare=False)

    def resolve(self, device_type: str, enforce_eager: bool) -> None:
        """CUDA graphs need CUDA; eager mode turns them off."""
        if device_type != "cuda" or enforce_eager:
            if self.cudagraph_mode not in (None, CUDAGraphMode.NONE):
                logger.info("cudagraph_mode %s -> NONE (%s).", self.cudagraph_mode.name,
                            "enforce_eager" if enforce_eager else f"no CUDA graphs on {device_type}")
            self.cudagraph_mode = CUDAGraphMode.NONE
        elif self.cudagraph_mode is None:
            self.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
        if self.cudagraph_capture_sizes is None:
            self.cudagraph_capture_sizes = default_capture_sizes()
