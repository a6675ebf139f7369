"""Padding a batch to a CUDA graph's size, for both model runners.

A full CUDA graph is recorded for a fixed token count N; a batch of T < N real
tokens replays it after being padded to N. Padding here adds *dummy
requests* after the real ones rather than teaching each attention kernel to
skip tokens: each dummy request starts at position 0 with all its tokens new
(seq_len == query_len), its slots are -1 (PAD_SLOT_ID: nothing is written to
the KV cache) and its block-table row is whatever the unused row holds (only
valid block ids, read and discarded). Every attention backend then sees an
ordinary batch of num_reqs_padded requests and N tokens; the outputs of the
dummy tokens are never read. Layouts:

  uniform decode, q tokens per request: (N - T) / q dummy requests of q tokens
      (the padded batch is still uniform; at most max_num_seqs requests, as
      the dispatcher only has decode graphs that fit);
  otherwise: one dummy request of N - T tokens.

A padding that does not fit (no spare request row, or a dummy request longer
than max_model_len) is not done: the batch runs eagerly instead.

A dummy run (warm-up, profile, capture) is the same layout with no real
request: `write_padding` with num_reqs = num_tokens = 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from vllm.config.compilation import CUDAGraphMode, full_graph_half
from vllm.forward_context import BatchDescriptor
from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
    from vllm.v1.worker.utils import AttentionGroup

logger = init_logger(__name__)

PAD_SLOT_ID = -1


@dataclass(frozen=True)
class PaddedBatch:
    """How one step runs: graph mode and key, and its padded shape."""

    runtime_mode: CUDAGraphMode
    batch_descriptor: BatchDescriptor | None
    num_reqs: int  # real requests
    num_tokens: int  # real tokens
    # [num_reqs_padded - num_reqs] tokens of each dummy request
    pad_query_lens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))

    @property
    def num_reqs_padded(self) -> int:
        return self.num_reqs + len(self.pad_query_lens)

    @property
    def num_tokens_padded(self) -> int:
        return self.num_tokens + int(self.pad_query_lens.sum())

    def dummy_layout(self) -> tuple[np.ndarray, np.ndarray]:
        """(positions of the dummy tokens, each request counting from 0;
        query end offsets of the dummy requests, after the real tokens)."""
        lens = self.pad_query_lens
        ends = np.cumsum(lens)
        positions = np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(ends - lens, lens)
        return positions, self.num_tokens + ends


def eager_batch(num_reqs: int, num_tokens: int) -> PaddedBatch:
    return PaddedBatch(CUDAGraphMode.NONE, None, num_reqs, num_tokens)


def plan_padding(
    runtime_mode: CUDAGraphMode,
    batch_descriptor: BatchDescriptor,
    num_reqs: int,
    num_tokens: int,
    max_num_reqs: int,
    max_model_len: int,
) -> PaddedBatch:
    """The padded batch for a dispatcher decision (NONE: no padding)."""
    if runtime_mode == CUDAGraphMode.NONE:
        return eager_batch(num_reqs, num_tokens)
    num_pad = batch_descriptor.num_tokens - num_tokens
    assert num_pad >= 0, (batch_descriptor, num_tokens)
    uniform_q = (
        num_tokens // num_reqs
        if batch_descriptor.uniform and num_reqs and num_tokens % num_reqs == 0
        else 0
    )
    if num_pad == 0:
        lens = np.zeros(0, dtype=np.int32)
    elif uniform_q and num_pad % uniform_q == 0:
        lens = np.full(num_pad // uniform_q, uniform_q, dtype=np.int32)
    else:
        lens = np.array([num_pad], dtype=np.int32)
    if num_reqs + len(lens) > max_num_reqs or (len(lens) and int(lens.max()) > max_model_len):
        return eager_batch(num_reqs, num_tokens)
    return PaddedBatch(runtime_mode, batch_descriptor, num_reqs, num_tokens, lens)


def dummy_layout(
    dispatcher: CudagraphDispatcher,
    num_scheduled: np.ndarray,
    uniform_decode: bool,
    cudagraph_runtime_mode: CUDAGraphMode | None,
) -> PaddedBatch:
    """A dummy batch (warm-up, profile, capture) is all padding: no real
    request, `num_scheduled` tokens per fake one; under a graph mode, with
    the dispatcher's key for exactly its size (a capture run)."""
    num_reqs, num_tokens = len(num_scheduled), int(num_scheduled.sum())
    mode, desc = CUDAGraphMode.NONE, None
    if cudagraph_runtime_mode not in (None, CUDAGraphMode.NONE):
        mode, desc = dispatcher.dispatch(
            num_tokens, uniform_decode=uniform_decode, num_reqs=num_reqs
        )
        if mode != cudagraph_runtime_mode or desc.num_tokens != num_tokens:
            raise ValueError(
                f"No {cudagraph_runtime_mode.name} CUDA graph of {num_tokens} "
                f"tokens (dispatcher: {mode.name}, {desc})."
            )
    return PaddedBatch(mode, desc, 0, 0, num_scheduled)


def write_padding(
    padded: PaddedBatch,
    input_ids: np.ndarray,
    positions: np.ndarray,
    query_start_loc: np.ndarray,
    seq_lens: np.ndarray,
    slot_mappings: list[np.ndarray],
) -> None:
    """Lay the dummy requests out after the real ones in the host buffers
    (the real entries, [:num_tokens] and [:num_reqs + 1], are already filled).

    For pad_query_lens [3, 1] after T real tokens of R requests:
        positions[T:T + 4] = [0, 1, 2, 0]     input_ids[T:T + 4] = 0
        query_start_loc[R + 1:R + 3] = [T + 3, T + 4]   seq_lens[R:R + 2] = [3, 1]
        slot_mapping[T:T + 4] = -1 (every KV cache group)
    """
    lens = padded.pad_query_lens
    if not len(lens):
        return
    t, n = padded.num_tokens, padded.num_tokens_padded
    r, rp = padded.num_reqs, padded.num_reqs_padded
    positions[t:n], query_ends = padded.dummy_layout()
    input_ids[t:n] = 0
    if r == 0:  # a dummy run: no real request
        query_start_loc[0] = 0
    query_start_loc[r + 1 : rp + 1] = query_ends
    seq_lens[r:rp] = lens
    for slot_mapping in slot_mappings:
        slot_mapping[t:n] = PAD_SLOT_ID


def min_cudagraph_support(attn_groups: list[list[AttentionGroup]], vllm_config: VllmConfig):
    """The weakest full-graph support among the model's attention backends."""
    from vllm.v1.attention.backend import AttentionCGSupport

    supports = [
        # A Mamba group's spec is a MambaSpec: the builder base's (upstream's)
        # AttentionSpec annotation is narrower than what builders receive.
        g.metadata_builder.get_cudagraph_support(vllm_config, g.kv_cache_spec)  # type: ignore[arg-type]
        for groups in attn_groups
        for g in groups
    ]
    return min(supports, key=lambda s: s.value, default=AttentionCGSupport.ALWAYS)


def _without_piecewise_past_graph_breaks(
    vllm_config: VllmConfig, mode: CUDAGraphMode
) -> CUDAGraphMode:
    """Piecewise graphs need every tensor between two pieces to come from a
    piece or an in-place splitting op. A stateful layer outside attention
    (Mamba, MLA) is a graph break that runs eagerly and hands the next piece
    freshly allocated tensors: keep only the full-graph half of the mode."""
    from vllm.compilation.backends import graph_break_layers

    if not mode.has_piecewise_cudagraphs():
        return mode
    breaks = graph_break_layers(vllm_config.compilation_config.static_forward_context)
    if not breaks:
        return mode
    narrowed = full_graph_half(mode)
    logger.info(
        "cudagraph_mode %s -> %s: %d stateful layers outside attention (e.g. %s) "
        "break the graph, and piecewise graphs cannot span them.",
        mode.name,
        narrowed.name,
        len(breaks),
        breaks[0],
    )
    return narrowed


def resolve_cudagraph_mode(
    vllm_config: VllmConfig, attn_groups: list[list[AttentionGroup]]
) -> CUDAGraphMode:
    """The configured mode, narrowed to what the attention backends and the
    parallel layout allow (upstream: GPUModelRunner._check_and_update_cudagraph_mode).

    ALWAYS keeps the mode; UNIFORM_* keeps only the decode half (FULL ->
    FULL_DECODE_ONLY); NEVER keeps only piecewise graphs (FULL_AND_PIECEWISE
    -> PIECEWISE), else turns graphs off. Pipeline parallelism turns them
    off too (the stages' intermediate tensors are not in persistent buffers),
    and so do MoE models (see below); stateful layers other than attention
    drop the piecewise half.
    """
    from vllm.v1.attention.backend import AttentionCGSupport

    mode = vllm_config.compilation_config.cudagraph_mode or CUDAGraphMode.NONE
    if mode == CUDAGraphMode.NONE:
        return mode
    if vllm_config.parallel_config.pipeline_parallel_size > 1:
        logger.info("cudagraph_mode %s -> NONE: pipeline parallelism runs eagerly.", mode.name)
        return CUDAGraphMode.NONE
    model_config = vllm_config.model_config
    if model_config is not None and model_config.is_moe:
        # FusedMoE here loops over the experts that received tokens, which
        # needs their counts on the host: not capturable.
        logger.info(
            "cudagraph_mode %s -> NONE: the MoE layer synchronises with the "
            "host (per-expert loop).",
            mode.name,
        )
        return CUDAGraphMode.NONE
    mode = _without_piecewise_past_graph_breaks(vllm_config, mode)
    support = min_cudagraph_support(attn_groups, vllm_config)
    if support == AttentionCGSupport.NEVER:
        # Piecewise graphs never hold attention: they stay.
        narrowed = (
            CUDAGraphMode.PIECEWISE if mode.has_piecewise_cudagraphs() else CUDAGraphMode.NONE
        )
    elif support != AttentionCGSupport.ALWAYS and mode.mixed_mode() == CUDAGraphMode.FULL:
        narrowed = CUDAGraphMode.FULL_DECODE_ONLY
    else:
        narrowed = mode
    if narrowed != mode:
        logger.info(
            "cudagraph_mode %s -> %s: the attention backends' CUDA graph support is %s.",
            mode.name,
            narrowed.name,
            support.name,
        )
    return narrowed
