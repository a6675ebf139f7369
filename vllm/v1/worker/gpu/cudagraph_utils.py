"""CUDA graphs for Model Runner V2 (upstream: vllm/v1/worker/gpu/cudagraph_utils.py).

V2 does not wrap the model: `CudaGraphManager` owns the full graphs. The
runner asks `dispatch(num_reqs, num_tokens, uniform_token_count)` once per
step; a `BatchExecutionDescriptor` means "pad to this size and replay", None
means "run eagerly". A PIECEWISE descriptor is replayed by the model itself:
the runner calls it under that runtime mode and descriptor, and each piece of
the split graph replays its own graph (vllm/compilation/piecewise_backend.py).
Which sizes have graphs is the same decision as V1's (a
`CudagraphDispatcher` holds the keys); padding is the same dummy-request
layout (vllm/v1/worker/cudagraph_padding.py), written here into V2's device
buffers. `capture` records one graph per key at start-up, largest first, in
one shared memory pool; `run_fullgraph` replays one and returns its static
hidden states (overwritten by the next replay).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from vllm.config.compilation import CUDAGraphMode
from vllm.forward_context import BatchDescriptor, set_forward_context
from vllm.logger import init_logger
from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
from vllm.v1.worker.cudagraph_padding import PaddedBatch, eager_batch, plan_padding
from vllm.v1.worker.gpu.attn_utils import build_attn_metadata

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.worker.gpu.block_table import BlockTables
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers
    from vllm.v1.worker.utils import AttentionGroup

logger = init_logger(__name__)


@dataclass(frozen=True)
class BatchExecutionDescriptor:
    """One captured graph: its mode and padded shape."""

    cg_mode: CUDAGraphMode
    num_tokens: int
    # Requests of a uniform decode graph (None: a mixed-batch graph).
    num_reqs: int | None = None
    # Query length of every request in a uniform graph.
    uniform_token_count: int | None = None

    @property
    def batch_descriptor(self) -> BatchDescriptor:
        return BatchDescriptor(
            self.num_tokens, num_reqs=self.num_reqs, uniform=self.uniform_token_count is not None
        )


# Prepares a dummy batch of a descriptor's shape in the persistent buffers:
# (attention metadata, input_ids, positions).
PrepareFn = Callable[[BatchExecutionDescriptor], tuple[dict[str, Any], torch.Tensor, torch.Tensor]]


class CudaGraphManager:
    def __init__(self, vllm_config: VllmConfig, device: torch.device) -> None:
        self.vllm_config = vllm_config
        self.device = device
        self.dispatcher = CudagraphDispatcher(vllm_config)
        self.cudagraph_mode = CUDAGraphMode.NONE
        self.uniform_decode_query_len = 1
        self.graphs: dict[BatchExecutionDescriptor, torch.cuda.CUDAGraph] = {}
        # PIECEWISE descriptors whose pieces were captured (the model holds them).
        self.piecewise_captured: set[BatchExecutionDescriptor] = set()
        # Static outputs of each graph: [num_tokens, hidden].
        self.hidden_states: dict[BatchExecutionDescriptor, torch.Tensor] = {}

    def initialize(self, cudagraph_mode: CUDAGraphMode, uniform_decode_query_len: int = 1) -> None:
        """Keys for `cudagraph_mode` (already narrowed to what the attention
        backends allow)."""
        self.cudagraph_mode = cudagraph_mode
        self.uniform_decode_query_len = uniform_decode_query_len
        self.dispatcher.initialize_cudagraph_keys(cudagraph_mode, uniform_decode_query_len)

    def dispatch(
        self,
        num_reqs: int,
        num_tokens: int,
        uniform_token_count: int | None,
        has_lora: bool = False,
    ) -> BatchExecutionDescriptor | None:
        """The graph for a batch (None: run eagerly). `uniform_token_count` is
        the query length shared by every request, None when they differ.
        Graphs are captured with no LoRA adapter active: a batch with some
        (`has_lora`) has no key and runs eagerly."""
        uniform = uniform_token_count == self.uniform_decode_query_len
        mode, desc = self.dispatcher.dispatch(
            num_tokens, uniform_decode=uniform, has_lora=has_lora, num_reqs=num_reqs
        )
        if mode == CUDAGraphMode.NONE:
            return None
        return BatchExecutionDescriptor(
            mode,
            desc.num_tokens,
            desc.num_reqs,
            uniform_token_count if desc.uniform else None,
        )

    def get_capture_descs(self) -> list[BatchExecutionDescriptor]:
        """Every key, per mode, largest first."""
        q = self.uniform_decode_query_len
        return [
            BatchExecutionDescriptor(mode, d.num_tokens, d.num_reqs, q if d.uniform else None)
            for mode, descs in self.dispatcher.get_capture_descs()
            for d in descs
        ]

    def has_graph(self, desc: BatchExecutionDescriptor) -> bool:
        return desc in self.graphs or desc in self.piecewise_captured

    @torch.inference_mode()
    def capture(self, prepare: PrepareFn, model: Callable[..., torch.Tensor]) -> int:
        """Capture every key: an eager run of the dummy batch (Triton and
        Inductor compile there), then the recording: a full graph here, or
        the model's pieces under the PIECEWISE runtime mode. Returns the
        number of keys captured."""
        # A pool of this manager's own (see get_global_graph_pool for why not
        # the process-wide one), shared by its graphs: largest first.
        pool = torch.cuda.graph_pool_handle()
        for desc in self.get_capture_descs():
            attn_metadata, input_ids, positions = prepare(desc)
            with set_forward_context(attn_metadata, self.vllm_config, num_tokens=desc.num_tokens):
                model(input_ids=input_ids, positions=positions)
            if desc.cg_mode == CUDAGraphMode.PIECEWISE:
                with self.forward_context(attn_metadata, desc):
                    model(input_ids=input_ids, positions=positions)
                self.piecewise_captured.add(desc)
                continue
            with set_forward_context(attn_metadata, self.vllm_config, num_tokens=desc.num_tokens):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    hidden_states = model(input_ids=input_ids, positions=positions)
            self.graphs[desc] = graph
            self.hidden_states[desc] = hidden_states
        if self.graphs or self.piecewise_captured:
            torch.cuda.synchronize(self.device)
        return len(self.graphs) + len(self.piecewise_captured)

    def forward_context(
        self, attn_metadata: dict[str, Any] | None, desc: BatchExecutionDescriptor
    ) -> AbstractContextManager[Any]:
        """The forward context of a PIECEWISE step or capture: the model's
        piece wrappers read the runtime mode and the graph key from it."""
        return set_forward_context(
            attn_metadata,
            self.vllm_config,
            num_tokens=desc.num_tokens,
            cudagraph_runtime_mode=CUDAGraphMode.PIECEWISE,
            batch_descriptor=desc.batch_descriptor,
        )

    def run_fullgraph(self, desc: BatchExecutionDescriptor) -> torch.Tensor:
        """Replay the graph of `desc` over the inputs already in the persistent
        buffers; returns its static hidden states [desc.num_tokens, hidden]."""
        graph = self.graphs.get(desc)
        if graph is None:
            raise RuntimeError(f"No CUDA graph was captured for {desc}.")
        graph.replay()
        return self.hidden_states[desc]


def dispatch_and_plan(
    manager: CudaGraphManager,
    num_scheduled: np.ndarray,
    num_tokens: int,
    max_num_reqs: int,
    max_model_len: int,
    has_lora: bool = False,
) -> tuple[BatchExecutionDescriptor | None, PaddedBatch]:
    """The manager's graph for a batch and the padding it needs (None and an
    unpadded batch when it runs eagerly)."""
    num_reqs = len(num_scheduled)
    uniform = int(num_scheduled[0]) if (num_scheduled == num_scheduled[0]).all() else None
    desc = manager.dispatch(num_reqs, num_tokens, uniform, has_lora)
    if desc is None:
        return None, eager_batch(num_reqs, num_tokens)
    padded = plan_padding(
        desc.cg_mode, desc.batch_descriptor, num_reqs, num_tokens, max_num_reqs, max_model_len
    )
    return (desc if padded.runtime_mode != CUDAGraphMode.NONE else None), padded


def pad_input_buffers(padded: PaddedBatch, bufs: InputBuffers) -> None:
    """Write the dummy requests after the real ones in V2's device buffers:
    input ids 0, positions from 0 in each dummy request, their query starts
    and sequence lengths (slots past the real tokens are already padding)."""
    lens = padded.pad_query_lens
    if not len(lens):
        return
    t, n = padded.num_tokens, padded.num_tokens_padded
    r, rp = padded.num_reqs, padded.num_reqs_padded
    positions, query_ends = padded.dummy_layout()
    bufs.input_ids[t:n].zero_()
    bufs.positions[t:n].copy_(torch.from_numpy(positions))
    bufs.query_start_loc[r + 1 : rp + 1].copy_(torch.from_numpy(query_ends.astype(np.int32)))
    bufs.seq_lens[r:rp].copy_(torch.from_numpy(lens))


def build_padded_attn_metadata(
    attn_groups: list[list[AttentionGroup]],
    input_batch: InputBatch,
    padded: PaddedBatch,
    bufs: InputBuffers,
    block_tables: BlockTables,
) -> dict[str, Any]:
    """Attention metadata over the padded batch: the real requests' gathered
    block-table rows plus the spare rows after them (valid block ids, read
    and discarded by the dummy requests), persistent buffers throughout."""
    lens = padded.pad_query_lens
    rp, n = padded.num_reqs_padded, padded.num_tokens_padded
    qsl_np = np.concatenate(
        [input_batch.query_start_loc_np, padded.num_tokens + np.cumsum(lens)]
    ).astype(np.int32)
    seq_lens_np = np.concatenate([input_batch.seq_lens_np, lens]).astype(np.int32)
    num_computed = np.concatenate(
        [input_batch.num_computed_tokens_np, np.zeros(len(lens), np.int32)]
    ).astype(np.int32)
    return build_attn_metadata(
        attn_groups,
        rp,
        n,
        bufs.query_start_loc[: rp + 1],
        torch.from_numpy(qsl_np),
        bufs.seq_lens[:rp],
        torch.from_numpy(seq_lens_np),
        torch.from_numpy(num_computed),
        max_query_len=int((qsl_np[1:] - qsl_np[:-1]).max()),
        max_seq_len=int(seq_lens_np.max()),
        block_tables=tuple(t[:rp] for t in block_tables.input_block_tables),
        slot_mappings=block_tables.slot_mappings[:, :n],
    )
