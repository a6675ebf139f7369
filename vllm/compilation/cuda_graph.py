"""Capture and replay of CUDA graphs around a callable
(upstream: vllm/compilation/cuda_graph.py).

A `CUDAGraphWrapper` is bound to one runtime mode: FULL (it wraps the whole
model) or PIECEWISE (it wraps one piece of the split graph,
vllm/compilation/piecewise_backend.py). On each call it reads the forward context: when the runtime
mode there is its own, it replays the graph recorded for the context's
`BatchDescriptor`, capturing it first if there is none; otherwise it calls the
wrapped model directly. It never decides anything itself: the dispatcher
(vllm/v1/cudagraph_dispatcher.py) has already chosen the mode and the padded
size, and the runner has laid the inputs out in persistent buffers, so the
tensors a replay reads are the ones the capture saw.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import torch

from vllm.config.compilation import CUDAGraphMode
from vllm.forward_context import BatchDescriptor, get_forward_context
from vllm.logger import init_logger
from vllm.utils.torch_utils import weak_ref_tensors

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)

_global_graph_pool: Any = None

# The wrapped callable's type: `unwrap()` gives it back as such.
_Runnable = TypeVar("_Runnable", bound=Callable[..., Any])


def get_global_graph_pool() -> Any:
    """One memory pool id for the whole process (upstream's helper). The
    runners do not use it: once every graph in a pool is freed (an engine shut
    down), the caching allocator may still hold the pool with no users, and a
    new capture into the same id trips its `use_count > 0` assert. Each runner
    takes its own id from `torch.cuda.graph_pool_handle()` instead."""
    global _global_graph_pool
    if _global_graph_pool is None:
        _global_graph_pool = torch.cuda.graph_pool_handle()
    return _global_graph_pool


@dataclass
class CUDAGraphOptions:
    debug_log_enable: bool = True
    # Check on every replay that the tensor arguments sit where they sat at
    # capture (cheap: pointer comparisons).
    check_input_addresses: bool = True
    # Keep the capture's outputs as weak references (vllm/utils/torch_utils.py),
    # so that graphs captured later may reuse their memory: set for the
    # pieces of piecewise graphs, whose outputs are read before the next replay.
    weak_ref_output: bool = False


@dataclass
class CUDAGraphEntry:
    batch_descriptor: BatchDescriptor
    cudagraph: torch.cuda.CUDAGraph | None = None
    # The capture's outputs: static tensors in the graph pool that every
    # replay overwrites.
    output: Any = None
    input_addresses: list[int] = field(default_factory=list)


def _tensor_addresses(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[int]:
    values = list(args) + [kwargs[k] for k in sorted(kwargs)]
    return [v.data_ptr() for v in values if isinstance(v, torch.Tensor)]


class CUDAGraphWrapper(Generic[_Runnable]):
    """Wraps `runnable` with capture/replay for one runtime mode.

    Contract (as upstream's): the caller has run each shape eagerly once
    before its first capture, so that cuBLAS handles, workspaces and Triton
    kernels exist; creating them inside a capture fails it. The V1 runner's
    capture loop (vllm/v1/worker/cudagraph_manager.py:CudaGraphManager.capture)
    does that."""

    def __init__(
        self,
        runnable: _Runnable,
        vllm_config: VllmConfig | None,
        runtime_mode: CUDAGraphMode,
        cudagraph_options: CUDAGraphOptions | None = None,
    ) -> None:
        if runtime_mode not in (CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE):
            raise ValueError(
                f"A CUDAGraphWrapper captures FULL or PIECEWISE graphs, not {runtime_mode.name}."
            )
        self.runnable = runnable
        self.vllm_config = vllm_config
        self.runtime_mode = runtime_mode
        self.cudagraph_options = cudagraph_options or CUDAGraphOptions()
        # The owner (the V1 runner) sets its own pool id; else a fresh one is
        # taken at the first capture (so a wrapper can exist without CUDA).
        # Graphs are captured largest first and replayed one at a time, so
        # the smaller ones fit in the memory the largest one reserved.
        self.graph_pool: Any = None
        self.concrete_cudagraph_entries: dict[BatchDescriptor, CUDAGraphEntry] = {}

    def __getattr__(self, key: str) -> Any:
        # Only reached for attributes the wrapper lacks: the model's own
        # (compute_logits, make_empty_intermediate_tensors, ...).
        runnable = self.__dict__.get("runnable")
        if runnable is None:
            raise AttributeError(key)
        return getattr(runnable, key)

    def unwrap(self) -> _Runnable:
        return self.runnable

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ctx = get_forward_context()
        mode, desc = ctx.cudagraph_runtime_mode, ctx.batch_descriptor
        if mode == CUDAGraphMode.NONE or mode != self.runtime_mode:
            return self.runnable(*args, **kwargs)
        if desc is None:
            raise RuntimeError(f"Runtime mode {mode.name} without a batch descriptor.")
        entry = self.concrete_cudagraph_entries.get(desc)
        if entry is None:
            entry = self.concrete_cudagraph_entries[desc] = CUDAGraphEntry(desc)
        if entry.cudagraph is None:
            # The capture's own output, strongly held until the caller drops
            # it: within the capturing forward the allocator must not reuse
            # its memory (the entry may hold only a weak reference).
            graph, output = self._capture(entry, args, kwargs)
            graph.replay()  # capture only records: compute this call's output
            return output
        if self.cudagraph_options.check_input_addresses:
            addresses = _tensor_addresses(args, kwargs)
            if addresses != entry.input_addresses:
                raise RuntimeError(
                    f"CUDA graph {desc}: input tensors moved since capture "
                    f"({entry.input_addresses} -> {addresses}); inputs must live in "
                    "persistent buffers."
                )
        entry.cudagraph.replay()
        return entry.output

    def _capture(
        self, entry: CUDAGraphEntry, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[torch.cuda.CUDAGraph, Any]:
        """Record one graph into `entry`; returns it and the capture's output
        tensors (not yet computed: the caller replays once)."""
        if self.cudagraph_options.debug_log_enable:
            logger.debug(
                "Capturing a %s CUDA graph for %s", self.runtime_mode.name, entry.batch_descriptor
            )
        if self.graph_pool is None:
            self.graph_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.graph_pool):
            output = self.runnable(*args, **kwargs)
        entry.input_addresses = _tensor_addresses(args, kwargs)
        entry.output = (
            weak_ref_tensors(output) if self.cudagraph_options.weak_ref_output else output
        )
        entry.cudagraph = graph
        return graph, output
