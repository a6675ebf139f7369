"""Compilation and CUDA graph configuration (upstream: vllm/config/compilation.py).

Piecewise CUDA graphs need the graph split at attention that only
`CompilationMode.VLLM_COMPILE` makes (vllm/compilation/piecewise_backend.py).
Under any other mode the modes that ask for them resolve to the closest mode
that needs none (see `CompilationConfig.resolve`): PIECEWISE -> NONE,
FULL_AND_PIECEWISE -> FULL_DECODE_ONLY (full graphs for uniform decode
batches, mixed batches eager). Deviation from upstream, until the GPU run
measures it: the default mode on CUDA is NONE, not VLLM_COMPILE.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from vllm.logger import init_logger

logger = init_logger(__name__)

# The ops piecewise graphs split at by default (vllm/compilation/backends.py).
ATTENTION_SPLITTING_OPS = ("vllm::unified_attention", "vllm::unified_attention_with_output")

# Upstream's ceiling on the largest capture size when none is configured.
_DEFAULT_MAX_CAPTURE_SIZE = 512


class CompilationMode(enum.IntEnum):
    NONE = 0
    STOCK_TORCH_COMPILE = 1
    DYNAMO_TRACE_ONCE = 2
    VLLM_COMPILE = 3


class CUDAGraphMode(enum.Enum):
    """NONE, PIECEWISE and FULL are runtime modes (what one forward does);
    the two tuple members are (decode mode, mixed mode) pairs that the
    dispatcher splits per batch."""

    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = (FULL, NONE)
    FULL_AND_PIECEWISE = (FULL, PIECEWISE)

    def decode_mode(self) -> CUDAGraphMode:
        """Mode for uniform decode batches."""
        return CUDAGraphMode(self.value[0]) if self.separate_routine() else self

    def mixed_mode(self) -> CUDAGraphMode:
        """Mode for prefill / mixed batches."""
        return CUDAGraphMode(self.value[1]) if self.separate_routine() else self

    def has_mode(self, mode: CUDAGraphMode) -> bool:
        if mode.separate_routine():
            raise ValueError(f"has_mode() takes a runtime mode, not {mode.name}.")
        if self.separate_routine():
            return mode.value in self.value
        return self == mode

    def requires_piecewise_compilation(self) -> bool:
        return self.has_mode(CUDAGraphMode.PIECEWISE)

    def max_cudagraph_mode(self) -> CUDAGraphMode:
        return CUDAGraphMode(max(self.value)) if self.separate_routine() else self

    def has_full_cudagraphs(self) -> bool:
        return self.max_cudagraph_mode() == CUDAGraphMode.FULL

    def has_piecewise_cudagraphs(self) -> bool:
        return self.requires_piecewise_compilation()

    def separate_routine(self) -> bool:
        return isinstance(self.value, tuple)

    @classmethod
    def valid_runtime_modes(cls) -> frozenset[CUDAGraphMode]:
        return frozenset({cls.NONE, cls.PIECEWISE, cls.FULL})

    def is_valid_runtime_mode(self) -> bool:
        return self in CUDAGraphMode.valid_runtime_modes()

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, value: CUDAGraphMode | str | int) -> CUDAGraphMode:
        """A mode from its name (any case, as `-cc '{"cudagraph_mode": "full"}'`
        gives it), its integer value, or the member itself."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            member = cls.__members__.get(value.strip().upper())
            if member is not None:
                return member
        elif isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                pass
        raise ValueError(
            f"Invalid cudagraph_mode {value!r}; choose one of {', '.join(cls.__members__)}."
        )


PERFORMANCE_MODES = ("balanced", "interactivity", "throughput")


def default_capture_sizes(max_size: int = _DEFAULT_MAX_CAPTURE_SIZE) -> list[int]:
    """1, 2, 4, then every 8 below 256, then every 16 up to max_size."""
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max_size + 1, 16))
    return [s for s in sizes if s <= max_size]


@dataclass
class CompilationConfig:
    mode: CompilationMode = CompilationMode.NONE
    # torch.compile backend for the model forward when `mode` is not NONE
    # ("" = Inductor; "eager" / "aot_eager" trace without generating code).
    backend: str = ""
    # None: decided by `resolve` (FULL_AND_PIECEWISE on CUDA, as upstream, which
    # this build then narrows; NONE elsewhere).
    cudagraph_mode: CUDAGraphMode | None = None
    # Token counts a graph is captured for (ascending after resolution). None:
    # `default_capture_sizes` up to max_cudagraph_capture_size.
    cudagraph_capture_sizes: list[int] | None = None
    # Largest capture size. None: max(cudagraph_capture_sizes) when those are
    # given, else min(2 * max_num_seqs, 512) as upstream.
    max_cudagraph_capture_size: int | None = None
    # Ops the graph is split at under VLLM_COMPILE: each piece between them is
    # compiled, and captured under piecewise CUDA graphs, on its own; the ops
    # run eagerly. None: the attention ops when piecewise graphs are used,
    # else none (one graph).
    splitting_ops: list[str] | None = None
    # Layer prefix -> layer module (attention layers register themselves).
    static_forward_context: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # What the user set, so that `set_cudagraph_sizes` can be re-run with
    # the scheduler limits and still start from the user's values.
    _user_sizes: tuple[list[int] | None, int | None] = field(
        default=(None, None), init=False, repr=False, compare=False
    )
    # `--performance-mode`: "interactivity" captures every batch size up to 32
    # when the capture sizes are not given (set by EngineArgs, as upstream's
    # VllmConfig._set_cudagraph_sizes reads VllmConfig.performance_mode).
    performance_mode: str = field(default="balanced", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.mode = CompilationMode(self.mode)
        if self.cudagraph_mode is not None:
            self.cudagraph_mode = CUDAGraphMode.parse(self.cudagraph_mode)
        if self.cudagraph_capture_sizes is not None:
            sizes = list(self.cudagraph_capture_sizes)
            if not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes):
                raise ValueError(
                    "cudagraph_capture_sizes must be positive integers, "
                    f"got {self.cudagraph_capture_sizes!r}."
                )
            self.cudagraph_capture_sizes = sorted(set(sizes))
        size = self.max_cudagraph_capture_size
        if size is not None and (not isinstance(size, int) or size < 0):
            raise ValueError(
                f"max_cudagraph_capture_size must be a non-negative integer, got {size!r}."
            )
        self._user_sizes = (self.cudagraph_capture_sizes, size)
        if self.splitting_ops is not None:
            ops = self.splitting_ops
            if isinstance(ops, str) or not all(isinstance(o, str) and "::" in o for o in ops):
                raise ValueError(
                    f"splitting_ops must be a list of op names like "
                    f"'vllm::unified_attention_with_output', got {ops!r}."
                )
            self.splitting_ops = list(ops)
            if self.mode != CompilationMode.VLLM_COMPILE:
                raise ValueError(
                    f"splitting_ops takes effect only with compilation mode VLLM_COMPILE "
                    f"(3), not {self.mode.name}."
                )

    def register_stateful_layer(self, prefix: str, layer: Any, kind: str) -> None:
        """Enter a layer that keeps per-request state (its cache) in
        `static_forward_context` under its unique, non-empty prefix."""
        if not prefix or prefix in self.static_forward_context:
            raise ValueError(f"{kind} layers need a unique, non-empty prefix (got {prefix!r}).")
        self.static_forward_context[prefix] = layer

    def resolve(
        self,
        device_type: str,
        enforce_eager: bool,
        max_num_batched_tokens: int | None = None,
        max_num_seqs: int | None = None,
    ) -> None:
        """Settle the mode for this device and the capture sizes.

        CUDA graphs need CUDA; eager mode turns them off. Modes needing
        piecewise graphs are narrowed unless VLLM_COMPILE splits the graph
        (see the module docstring)."""
        if device_type != "cuda" or enforce_eager:
            if self.cudagraph_mode not in (None, CUDAGraphMode.NONE):
                logger.info(
                    "cudagraph_mode %s -> NONE (%s).",
                    self.cudagraph_mode.name,
                    "enforce_eager" if enforce_eager else f"no CUDA graphs on {device_type}",
                )
            self.cudagraph_mode = CUDAGraphMode.NONE
        elif self.cudagraph_mode is None:
            self.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
        if self.cudagraph_mode.has_piecewise_cudagraphs():
            why = self._why_no_piecewise()
            if why:
                self.cudagraph_mode = _without_piecewise(self.cudagraph_mode, why)
            elif self.splitting_ops is None:
                self.splitting_ops = list(ATTENTION_SPLITTING_OPS)
        self.set_cudagraph_sizes(max_num_batched_tokens, max_num_seqs)

    def _why_no_piecewise(self) -> str | None:
        """Why piecewise graphs cannot be captured here (None: they can)."""
        if self.mode != CompilationMode.VLLM_COMPILE:
            return (
                f"compilation mode {self.mode.name} does not split the graph; "
                "VLLM_COMPILE (-cc 3) does"
            )
        if self.splitting_ops == []:
            return "splitting_ops is empty: the graph is not split"
        return None

    def set_cudagraph_sizes(
        self, max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None
    ) -> None:
        """max_cudagraph_capture_size and the capture sizes, clipped to it and
        to max_num_batched_tokens (a graph never holds more tokens than a step).
        Idempotent: the worker calls it again once the scheduler limits are known.
        (Uniform decode graphs are further limited to max_num_seqs requests by
        the dispatchers, as upstream.)"""
        sizes, max_size = self._user_sizes
        if max_size is None:
            if sizes:
                max_size = max(sizes)
            elif max_num_seqs is not None:
                max_size = min(2 * max_num_seqs, _DEFAULT_MAX_CAPTURE_SIZE)
            else:
                max_size = _DEFAULT_MAX_CAPTURE_SIZE
        if max_num_batched_tokens is not None:
            max_size = min(max_size, max_num_batched_tokens)
        if sizes is None:
            sizes = default_capture_sizes(max_size)
            if self.performance_mode == "interactivity":
                # One graph per batch size up to 32: no padding of small batches.
                sizes = sorted(set(range(1, min(max_size, 32) + 1)) | set(sizes))
        self.cudagraph_capture_sizes = [s for s in sizes if s <= max_size]
        self.max_cudagraph_capture_size = max(self.cudagraph_capture_sizes, default=0)


def full_graph_half(mode: CUDAGraphMode) -> CUDAGraphMode:
    """A mode that asks for piecewise graphs without them: FULL_AND_PIECEWISE
    -> FULL_DECODE_ONLY, PIECEWISE -> NONE (any other mode is returned as is)."""
    if not mode.has_piecewise_cudagraphs():
        return mode
    if mode == CUDAGraphMode.FULL_AND_PIECEWISE:
        return CUDAGraphMode.FULL_DECODE_ONLY
    return CUDAGraphMode.NONE


def _without_piecewise(mode: CUDAGraphMode, why: str) -> CUDAGraphMode:
    """Keep only the full-graph half of a mode that asks for piecewise graphs."""
    narrowed = full_graph_half(mode)
    logger.info(
        "cudagraph_mode %s -> %s: piecewise CUDA graphs need the graph split "
        "at attention, and %s (%s).",
        mode.name,
        narrowed.name,
        why,
        "mixed batches run eagerly"
        if narrowed == CUDAGraphMode.FULL_DECODE_ONLY
        else "all batches run eagerly",
    )
    return narrowed
