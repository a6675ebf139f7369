"""Per-forward state that reaches the layers without threading it through
every `forward` signature (upstream: vllm/forward_context.py).

The model runner wraps each model call in `set_forward_context(...)`; an
`Attention` layer then reads its own metadata with
`get_forward_context().attn_metadata[layer_name]`. Keeping the metadata out of
the model signature is what lets every model keep the plain
`forward(input_ids, positions)` contract.

`set_forward_context` refuses to nest. The context also carries the CUDA
graph runtime mode and the `BatchDescriptor` of the forward, which
`CUDAGraphWrapper` reads to pick the graph to replay.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from vllm.config.compilation import CUDAGraphMode

if TYPE_CHECKING:
    from vllm.config import VllmConfig


class BatchDescriptor(NamedTuple):
    """The key of one CUDA graph: the (padded) shape of a batch.

    Two batches with equal descriptors can replay the same graph.
    """

    num_tokens: int
    # Requests in the batch; None when the graph serves any request count.
    num_reqs: int | None = None
    # Every request has the same query length (a uniform decode batch).
    uniform: bool = False
    has_lora: bool = False

    def relax_for_mixed_batch_cudagraphs(self) -> BatchDescriptor:
        """The descriptor of the general (mixed-batch) graph of the same size,
        which any batch of this many tokens can replay."""
        return BatchDescriptor(
            self.num_tokens, num_reqs=None, uniform=False, has_lora=self.has_lora
        )


@dataclass
class ForwardContext:
    """What the layers of one forward pass may read."""

    # Layer prefix -> module for the layers that the compiler must not trace
    # (attention); the same dict as `compilation_config.static_forward_context`.
    no_compile_layers: dict[str, Any]
    # Layer prefix -> that layer's attention metadata. None (or a None entry)
    # means a dummy/profile run: attention returns zeros and the cache is untouched.
    attn_metadata: dict[str, Any] | None
    # Pipeline-parallel virtual engine: selects `layer.kv_cache[virtual_engine]`.
    virtual_engine: int = 0
    # Number of tokens of this forward (padded count when the runner pads).
    num_tokens: int | None = None
    # Free-form extras a runner may attach (kept for forward compatibility).
    extra: dict[str, Any] = field(default_factory=dict)
    # What the CUDA graph wrappers do in this forward: NONE runs eagerly; FULL
    # captures or replays the graph keyed by `batch_descriptor`.
    cudagraph_runtime_mode: CUDAGraphMode = CUDAGraphMode.NONE
    batch_descriptor: BatchDescriptor | None = None


_forward_context: ForwardContext | None = None


def is_forward_context_available() -> bool:
    return _forward_context is not None


def get_forward_context() -> ForwardContext:
    """The current forward context; raises outside `set_forward_context`."""
    if _forward_context is None:
        raise RuntimeError(
            "Forward context is not set. Run the model inside "
            "`with set_forward_context(attn_metadata, vllm_config): ...`."
        )
    return _forward_context


@contextmanager
def set_forward_context(
    attn_metadata: dict[str, Any] | None,
    vllm_config: VllmConfig,
    virtual_engine: int = 0,
    num_tokens: int | None = None,
    cudagraph_runtime_mode: CUDAGraphMode = CUDAGraphMode.NONE,
    batch_descriptor: BatchDescriptor | None = None,
    **extra: Any,
) -> Iterator[ForwardContext]:
    """Make `attn_metadata` visible to the layers for the duration of a forward.

    Nesting is refused: a forward inside a forward would silently swap the
    metadata under the outer one.
    """
    global _forward_context
    if _forward_context is not None:
        raise RuntimeError("set_forward_context() cannot be nested.")
    if not cudagraph_runtime_mode.is_valid_runtime_mode():
        raise ValueError(
            f"cudagraph_runtime_mode must be NONE, PIECEWISE or FULL, "
            f"got {cudagraph_runtime_mode.name}."
        )
    static_ctx = vllm_config.compilation_config.static_forward_context
    _forward_context = ForwardContext(
        no_compile_layers=static_ctx,
        attn_metadata=attn_metadata,
        virtual_engine=virtual_engine,
        num_tokens=num_tokens,
        extra=dict(extra),
        cudagraph_runtime_mode=cudagraph_runtime_mode,
        batch_descriptor=batch_descriptor,
    )
    try:
        yield _forward_context
    finally:
        _forward_context = None
