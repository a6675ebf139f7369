"""CUDA graphs and dummy runs of the V1 model runner (upstream: the
`_dummy_run`, `_dummy_sampler_run`, `profile_run` and `capture_model`
methods of vllm/v1/worker/gpu_model_runner.py).

A mixin of `GPUModelRunner`, kept in its own module so the runner stays
within the house size limit; the methods are the runner's, with the same
names and signatures (the worker calls them on the runner). They use the
runner's model, persistent input buffers, dispatcher and `_commit_inputs`.
"""
from __future__ import annotations

import numpy as np
import torch

from vllm.compilation.cuda_graph import CUDAGraphWrapper
from vllm.config.compilation import CUDAGraphMode
from vllm.distributed import get_pp_group
from vllm.forward_context import set_forward_context
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.worker.cudagraph_padding import (capture_cudagraphs, dummy_layout,
                                              resolve_cudagraph_mode, write_padding)

class GPUModelRunnerDummyRunMixin:
    """Graph setup and capture, and forward passes over fake requests
    (warm-up, memory profiling, graph capture)."""

    def _init_cudagraphs(self) -> None:
        """Graph keys for the mode the backends allow; wrap the model for FULL."""
        mode = resolve_cudagraph_mode(self.vllm_config, self.attn_groups)
        self.cudagraph_dispatcher.initialize_cudagraph_keys(mode, uniform_decode_query_len=1)
        if mode.has_full_cudagraphs() and not isinstance(self.model, CUDAGraphWrapper):
            self.model = CUDAGraphWrapper(self.get_model(), self.vllm_config,
                                          CUDAGraphMode.FULL)

    def capture_model(self) -> int:
        """Capture every graph the dispatcher has a key for, largest first
        (called by the worker after warm-up); returns how many."""
        return capture_cudagraphs(self.cudagraph_dispatcher, self._dummy_run, self.device)

    # ---- dummy runs ------------------------------------------------------------
    @torch.inference_mode()
    def _dummy_run(self, num_tokens: int, use_kv_cache: bool = True,
                   num_reqs: int | None = None,
                   cudagraph_runtime_mode: CUDAGraphMode | None = None,
                   uniform_decode: bool = False) -> torch.Tensor:
        """Forward `num_tokens` dummy tokens spread over `num_reqs` (default
        min(num_tokens, max_num_reqs); one token each with `uniform_decode`)
        fake requests that start at position 0.

        The batch is laid out in the persistent input buffers, as a real step's
        (so a graph captured here replays real steps). With `use_kv_cache` (and
        a KV cache allocated) attention runs for real with every slot -1, so
        nothing is written; otherwise the layers get no metadata and skip
        attention (profile run). `cudagraph_runtime_mode` FULL captures (or
        replays) the graph the dispatcher has for this size. Returns the hidden
        states of each fake request's last token.
        """
        assert 0 < num_tokens <= self.max_num_tokens
        if uniform_decode:
            num_reqs = num_tokens
        num_reqs = num_reqs or min(num_tokens, self.max_num_reqs)
        assert num_reqs <= min(num_tokens, self.max_num_reqs)
        num_scheduled = np.full(num_reqs, num_tokens // num_reqs, dtype=np.int32)
        num_scheduled[-1] += num_tokens % num_reqs
        layout = dummy_layout(self.cudagraph_dispatcher, num_scheduled, uniform_decode,
                              cudagraph_runtime_mode)
        attn_metadata = None
        if use_kv_cache and self.attn_groups:
            attn_metadata = self._commit_inputs(
                layout, for_cudagraph_capture=layout.runtime_mode != CUDAGraphMode.NONE)
        else:
            write_padding(layout, self.input_ids.np, self.positions.np,
                          self.query_start_loc.np, self.seq_lens.np, [])
            self.input_ids.copy_to_gpu(num_tokens)
            self.positions.copy_to_gpu(num_tokens)
        # A later pipeline stage starts from zeros (stages run their dummy
        # batches independently).
        intermediate_tensors = None if get_pp_group().is_first_rank else (
            self.get_model().make_empty_intermediate_tensors(num_tokens, self.dtype,
                                                             self.device))
        with set_forward_context(attn_metadata, self.vllm_config, num_tokens=num_tokens,
                                 cudagraph_runtime_mode=layout.runtime_mode,
                                 batch_descriptor=layout.batch_descriptor):
            hidden_states = self.model(input_ids=self.input_ids.gpu[:num_tokens],
                                       positions=self.positions.gpu[:num_tokens],
                                       intermediate_tensors=intermediate_tensors)
        last = torch.from_numpy(np.cumsum(num_scheduled) - 1).to(self.device)
        return hidden_states[last]

    @torch.inference_mode()
    def _dummy_sampler_run(self, hidden_states: torch.Tensor) -> None:
        """Logits and a random top-k/top-p draw with logprobs for each row, so
        the sampler's kernels and buffers are exercised once (on the last
        pipeline stage: the others have no logits)."""
        if not get_pp_group().is_last_rank:
            return
        logits = self.get_model().compute_logits(hidden_states)
        n = logits.shape[0]
        metadata = SamplingMetadata(
            temperature=torch.full((n,), 0.5, device=self.device), all_greedy=False,
            all_random=True, top_p=torch.full((n,), 0.9, device=self.device),
            top_k=torch.full((n,), min(50, self.vocab_size), dtype=torch.int32,
                             device=self.device),
            min_p=None, generators={}, max_num_logprobs=self.model_config.max_logprobs)
        self.sampler(logits, metadata)

    def profile_run(self) -> None:
        """The largest step the scheduler can produce, without a KV cache: its
        peak memory is what the KV cache must leave room for."""
        hidden_states = self._dummy_run(self.max_num_tokens, use_kv_cache=False)
        self._dummy_sampler_run(hidden_states)
