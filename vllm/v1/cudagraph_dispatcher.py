"""Which CUDA graph, if any, a batch runs with (upstream: vllm/v1/cudagraph_dispatcher.py).

The dispatcher is the single source of truth about the graphs that exist: the
runner asks it once per step, with the batch's real token count, and gets back
the runtime mode (FULL, PIECEWISE or NONE) and the `BatchDescriptor` of the
graph to use, whose `num_tokens` is the real count rounded up to the next
capture size. Batches larger than the largest capture size run eagerly.

One name per role, in both model runners:
  `CudagraphDispatcher` (here, upstream)   the graph keys; `dispatch` picks one
      per batch. Both runners' managers own one.
  `CudaGraphManager`                       the runner's part for graphs:
      V1 vllm/v1/worker/cudagraph_manager.py, V2 vllm/v1/worker/gpu/cudagraph_utils.py
      (upstream's V2 name). `initialize(mode)` sets the keys, `dispatch` asks
      the dispatcher for a batch's graph (V1 returns the padded batch, V2 the
      graph's `BatchExecutionDescriptor`), `capture` records every key at
      start-up through the manager's own dummy batches.
  `CUDAGraphWrapper` (vllm/compilation/cuda_graph.py, upstream)   V1 only:
      wraps the model under FULL and records / replays the graph named by the
      descriptor it finds in the forward context. V2's manager holds its
      graphs itself (`run_fullgraph`).
  Padding a batch to a graph's size is shared: vllm/v1/worker/cudagraph_padding.py.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from vllm.config.compilation import CUDAGraphMode
from vllm.forward_context import BatchDescriptor

if TYPE_CHECKING:
    from vllm.config import VllmConfig


class CudagraphDispatcher:
    """Holds the valid graph keys per runtime mode and picks one per batch."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        self.vllm_config = vllm_config
        self.compilation_config = vllm_config.compilation_config
        self.cudagraph_mode = self.compilation_config.cudagraph_mode or CUDAGraphMode.NONE
        self.max_num_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.max_num_seqs = vllm_config.scheduler_config.max_num_seqs
        self.cudagraph_keys: dict[CUDAGraphMode, set[BatchDescriptor]] = {
            CUDAGraphMode.PIECEWISE: set(),
            CUDAGraphMode.FULL: set(),
        }
        self.uniform_decode_query_len = 1
        # Ascending sizes a batch may be padded to (those with some key).
        self._capture_sizes: list[int] = []
        self.keys_initialized = False

    def add_cudagraph_key(
        self, runtime_mode: CUDAGraphMode, batch_descriptor: BatchDescriptor
    ) -> None:
        if runtime_mode not in self.cudagraph_keys:
            raise ValueError(f"Graph keys are PIECEWISE or FULL, not {runtime_mode.name}.")
        self.cudagraph_keys[runtime_mode].add(batch_descriptor)

    def initialize_cudagraph_keys(
        self, cudagraph_mode: CUDAGraphMode, uniform_decode_query_len: int = 1
    ) -> None:
        """Create every key `cudagraph_mode` allows, once the attention backends
        are known (the runner may have narrowed the configured mode).

        Mixed-batch keys: one per capture size (<= max_num_batched_tokens).
        Uniform decode keys (a separate FULL routine only): capture sizes from
        `uniform_decode_query_len` up to max_num_seqs requests' worth, each for
        num_tokens // uniform_decode_query_len requests.
        """
        self.cudagraph_mode = cudagraph_mode
        self.uniform_decode_query_len = uniform_decode_query_len
        for keys in self.cudagraph_keys.values():
            keys.clear()
        sizes = [
            s
            for s in self.compilation_config.cudagraph_capture_sizes or []
            if s <= self.max_num_tokens
        ]
        if cudagraph_mode.mixed_mode() != CUDAGraphMode.NONE:
            for size in sizes:
                self.add_cudagraph_key(cudagraph_mode.mixed_mode(), BatchDescriptor(size))
        if cudagraph_mode.separate_routine() and cudagraph_mode.decode_mode() == CUDAGraphMode.FULL:
            q = uniform_decode_query_len
            max_decode_tokens = q * self.max_num_seqs
            for size in sizes:
                if q <= size <= max_decode_tokens and size % q == 0:
                    self.add_cudagraph_key(
                        CUDAGraphMode.FULL, BatchDescriptor(size, num_reqs=size // q, uniform=True)
                    )
        self._capture_sizes = sorted(
            {d.num_tokens for keys in self.cudagraph_keys.values() for d in keys}
        )
        self.keys_initialized = True

    def get_capture_descs(self) -> list[tuple[CUDAGraphMode, list[BatchDescriptor]]]:
        """Keys to capture, per runtime mode, largest first (so that smaller
        graphs reuse the memory pool the large ones grew)."""
        return [
            (mode, sorted(keys, key=lambda d: d.num_tokens, reverse=True))
            for mode, keys in self.cudagraph_keys.items()
            if keys
        ]

    def padded_num_tokens(self, num_tokens: int) -> int | None:
        """The smallest capture size >= num_tokens (None past the largest)."""
        i = bisect.bisect_left(self._capture_sizes, num_tokens)
        return self._capture_sizes[i] if i < len(self._capture_sizes) else None

    def dispatch(
        self,
        num_tokens: int,
        uniform_decode: bool = False,
        has_lora: bool = False,
        num_reqs: int | None = None,
        disable_full: bool = False,
    ) -> tuple[CUDAGraphMode, BatchDescriptor]:
        """(runtime mode, descriptor) for a batch of `num_tokens` real tokens.

        Priority: the uniform decode FULL graph, then the mixed FULL graph of
        the same padded size, then PIECEWISE; otherwise NONE with the
        unpadded descriptor (run eagerly).
        """
        eager = BatchDescriptor(
            num_tokens, num_reqs=num_reqs, uniform=uniform_decode, has_lora=has_lora
        )
        if not self.keys_initialized or self.cudagraph_mode == CUDAGraphMode.NONE:
            return CUDAGraphMode.NONE, eager
        padded = self.padded_num_tokens(num_tokens)
        if padded is None:
            return CUDAGraphMode.NONE, eager
        full_keys = self.cudagraph_keys[CUDAGraphMode.FULL]
        mixed = BatchDescriptor(padded, has_lora=has_lora)
        if not disable_full:
            if uniform_decode:
                uniform = BatchDescriptor(
                    padded,
                    num_reqs=padded // self.uniform_decode_query_len,
                    uniform=True,
                    has_lora=has_lora,
                )
                if uniform in full_keys:
                    return CUDAGraphMode.FULL, uniform
            if mixed in full_keys:
                return CUDAGraphMode.FULL, mixed
        if mixed in self.cudagraph_keys[CUDAGraphMode.PIECEWISE]:
            return CUDAGraphMode.PIECEWISE, mixed
        return CUDAGraphMode.NONE, eager
