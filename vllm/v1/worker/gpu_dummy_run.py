"""CUDA graphs and dummy runs of the V1 model runner (upstream: the
`_dummy_run`, `_dummy_sampler_run`, `profile_run` and `capture_model`
methods of vllm/v1/worker/gpu_model_runner.py).

`CudaGraphRunner` is a part `GPUModelRunner` owns, in the role of V2's
`CudaGraphManager` and padding helpers (vllm/v1/worker/gpu/cudagraph_utils.py):
the dispatcher's graph keys and each step's graph, padding a batch to that
graph and committing it to the device, capture, and the forward passes over
fake requests that warm-up, memory profiling and capture run. The runner keeps
upstream's method names as thin delegates (the worker and tests call them on
the runner).

The part holds what does not change: the config, the dispatcher, the sampler
and the runner's persistent input buffers. What the runner replaces after
construction is passed per call (as V2's `CudaGraphManager.capture` takes its
model): the model (loaded, wrapped for graphs, or a test's spy), the
persistent batch and the attention groups (both rebuilt by initialize_kv_cache).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn as nn

from vllm.compilation.cuda_graph import CUDAGraphWrapper
from vllm.config.compilation import CUDAGraphMode
from vllm.distributed import get_pp_group
from vllm.forward_context import set_forward_context
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.worker.cudagraph_padding import (
    PaddedBatch,
    capture_cudagraphs,
    dummy_layout,
    plan_padding,
    resolve_cudagraph_mode,
    write_padding,
)
from vllm.v1.worker.gpu_attn_metadata import build_attention_metadata
from vllm.v1.worker.utils import pp_dummy_intermediate_tensors

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker.gpu_input_batch import InputBatch
    from vllm.v1.worker.utils import AttentionGroup, CpuGpuBuffer


def unwrap_model(model: nn.Module | CUDAGraphWrapper | None) -> nn.Module:
    """The model itself, under the CUDAGraphWrapper full graphs put on it."""
    assert model is not None, "load_model() has not run"
    return model.unwrap() if isinstance(model, CUDAGraphWrapper) else model


class CudaGraphRunner:
    """Graph keys and the model's wrapper, each step's graph and padding,
    the padded inputs on the device, capture, and dummy runs."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        device: torch.device,
        dispatcher: CudagraphDispatcher,
        sampler: Sampler,
        input_ids: CpuGpuBuffer,
        positions: CpuGpuBuffer,
        query_start_loc: CpuGpuBuffer,
        seq_lens: CpuGpuBuffer,
    ) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.device = device
        self.dispatcher = dispatcher
        self.sampler = sampler
        self.input_ids, self.positions = input_ids, positions
        self.query_start_loc, self.seq_lens = query_start_loc, seq_lens
        self.max_num_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        self.max_model_len = self.model_config.max_model_len

    def init_cudagraphs(
        self, model: nn.Module | CUDAGraphWrapper | None, attn_groups: list[list[AttentionGroup]]
    ) -> nn.Module | CUDAGraphWrapper | None:
        """Graph keys for the mode the backends allow; returns the model,
        wrapped in a CUDAGraphWrapper under FULL."""
        mode = resolve_cudagraph_mode(self.vllm_config, attn_groups)
        self.dispatcher.initialize_cudagraph_keys(mode, uniform_decode_query_len=1)
        if mode.has_full_cudagraphs() and not isinstance(model, CUDAGraphWrapper):
            return CUDAGraphWrapper(unwrap_model(model), self.vllm_config, CUDAGraphMode.FULL)
        return model

    def dispatch(self, num_scheduled: np.ndarray, num_tokens: int) -> PaddedBatch:
        """The dispatcher's graph for a real batch and the padding it needs."""
        num_reqs = len(num_scheduled)
        uniform_decode = bool((num_scheduled == 1).all())
        mode, desc = self.dispatcher.dispatch(
            num_tokens, uniform_decode=uniform_decode, num_reqs=num_reqs
        )
        return plan_padding(mode, desc, num_reqs, num_tokens, self.max_num_reqs, self.max_model_len)

    def commit_inputs(
        self,
        padded: PaddedBatch,
        input_batch: InputBatch,
        attn_groups: list[list[AttentionGroup]],
        for_cudagraph_capture: bool = False,
    ) -> dict[str, object]:
        """Pad the host buffers, copy them to the device and build the
        attention metadata over the padded batch (the real entries are filled)."""
        block_table = input_batch.block_table
        write_padding(
            padded,
            self.input_ids.np,
            self.positions.np,
            self.query_start_loc.np,
            self.seq_lens.np,
            [bt.slot_mapping.np for bt in block_table.block_tables],
        )
        num_reqs, num_tokens = padded.num_reqs_padded, padded.num_tokens_padded
        block_table.commit_block_table(padded.num_reqs)
        block_table.commit_slot_mapping(num_tokens)
        self.input_ids.copy_to_gpu(num_tokens)
        self.positions.copy_to_gpu(num_tokens)
        self.query_start_loc.copy_to_gpu(num_reqs + 1)
        self.seq_lens.copy_to_gpu(num_reqs)
        # Tokens already cached: the real requests', 0 for the dummy ones.
        num_computed = input_batch.num_computed_tokens_cpu_tensor[: padded.num_reqs]
        if num_reqs > padded.num_reqs:
            num_computed = torch.cat(
                [num_computed, num_computed.new_zeros(num_reqs - padded.num_reqs)]
            )
        qsl = self.query_start_loc.np[: num_reqs + 1]
        return build_attention_metadata(
            attn_groups,
            block_table,
            self.query_start_loc,
            self.seq_lens,
            num_reqs,
            num_tokens,
            int((qsl[1:] - qsl[:-1]).max()),
            int(self.seq_lens.np[:num_reqs].max()),
            num_computed,
            for_cudagraph_capture,
        )

    def capture(self, dummy_run: Callable[..., object]) -> int:
        """Capture every graph the dispatcher has a key for, largest first,
        through `dummy_run` (the runner's `_dummy_run`); returns how many."""
        return capture_cudagraphs(self.dispatcher, dummy_run, self.device)

    # ---- dummy runs ------------------------------------------------------------
    @torch.inference_mode()
    def dummy_run(
        self,
        model: nn.Module | CUDAGraphWrapper | None,
        input_batch: InputBatch,
        attn_groups: list[list[AttentionGroup]],
        num_tokens: int,
        num_reqs: int | None = None,
        cudagraph_runtime_mode: CUDAGraphMode | None = None,
        uniform_decode: bool = False,
    ) -> torch.Tensor:
        """Forward `num_tokens` dummy tokens spread over `num_reqs` (default
        min(num_tokens, max_num_reqs); one token each with `uniform_decode`)
        fake requests that start at position 0.

        The batch is laid out in the persistent input buffers, as a real step's
        (so a graph captured here replays real steps). With `attn_groups` (a
        KV cache) attention runs for real with every slot -1, so nothing is
        written; with none the layers get no metadata and skip attention
        (profile run). `cudagraph_runtime_mode` FULL captures (or replays) the
        graph the dispatcher has for this size. Returns the hidden states of
        each fake request's last token.
        """
        assert model is not None, "load_model() has not run"
        assert 0 < num_tokens <= self.max_num_tokens
        if uniform_decode:
            num_reqs = num_tokens
        num_reqs = num_reqs or min(num_tokens, self.max_num_reqs)
        assert num_reqs <= min(num_tokens, self.max_num_reqs)
        num_scheduled = np.full(num_reqs, num_tokens // num_reqs, dtype=np.int32)
        num_scheduled[-1] += num_tokens % num_reqs
        layout = dummy_layout(
            self.dispatcher, num_scheduled, uniform_decode, cudagraph_runtime_mode
        )
        attn_metadata = None
        if attn_groups:
            attn_metadata = self.commit_inputs(
                layout,
                input_batch,
                attn_groups,
                for_cudagraph_capture=layout.runtime_mode != CUDAGraphMode.NONE,
            )
        else:
            write_padding(
                layout,
                self.input_ids.np,
                self.positions.np,
                self.query_start_loc.np,
                self.seq_lens.np,
                [],
            )
            self.input_ids.copy_to_gpu(num_tokens)
            self.positions.copy_to_gpu(num_tokens)
        intermediate_tensors = pp_dummy_intermediate_tensors(
            unwrap_model(model), num_tokens, self.model_config.dtype, self.device
        )
        with set_forward_context(
            attn_metadata,
            self.vllm_config,
            num_tokens=num_tokens,
            cudagraph_runtime_mode=layout.runtime_mode,
            batch_descriptor=layout.batch_descriptor,
        ):
            hidden_states = model(
                input_ids=self.input_ids.gpu[:num_tokens],
                positions=self.positions.gpu[:num_tokens],
                intermediate_tensors=intermediate_tensors,
            )
        last = torch.from_numpy(np.cumsum(num_scheduled) - 1).to(self.device)
        return hidden_states[last]

    @torch.inference_mode()
    def dummy_sampler_run(self, model: nn.Module, hidden_states: torch.Tensor) -> None:
        """Logits and a random top-k/top-p draw with logprobs for each row, so
        the sampler's kernels and buffers are exercised once (on the last
        pipeline stage: the others have no logits)."""
        if not get_pp_group().is_last_rank:
            return
        logits = model.compute_logits(hidden_states)
        n = logits.shape[0]
        vocab_size = self.model_config.get_vocab_size()
        metadata = SamplingMetadata(
            temperature=torch.full((n,), 0.5, device=self.device),
            all_greedy=False,
            all_random=True,
            top_p=torch.full((n,), 0.9, device=self.device),
            top_k=torch.full((n,), min(50, vocab_size), dtype=torch.int32, device=self.device),
            min_p=None,
            generators={},
            max_num_logprobs=self.model_config.max_logprobs,
        )
        self.sampler(logits, metadata)
