"""Dummy runs of the V1 model runner: forward passes over fake requests
(upstream: `_dummy_run` and `_dummy_sampler_run` of
vllm/v1/worker/gpu_model_runner.py, which keeps both names as delegates).

Warm-up, memory profiling (`GPUModelRunner.profile_run`) and CUDA graph
capture (`CudaGraphManager.capture`, vllm/v1/worker/cudagraph_manager.py) run
them. A dummy batch is laid out in the persistent input buffers exactly as a
real step's, so a graph captured over it replays real steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from vllm.config.compilation import CUDAGraphMode
from vllm.distributed import get_pp_group
from vllm.forward_context import set_forward_context
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.worker.cudagraph_padding import dummy_layout
from vllm.v1.worker.utils import get_model_config, pp_dummy_intermediate_tensors, resolved_dtype

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.model import ModelConfig
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker.gpu_input_batch import InputBatch
    from vllm.v1.worker.gpu_input_buffers import InputBuffers
    from vllm.v1.worker.utils import AttentionGroup, TextGenerationModel


@torch.inference_mode()
def dummy_run(
    vllm_config: VllmConfig,
    model: TextGenerationModel,
    buffers: InputBuffers,
    input_batch: InputBatch,
    attn_groups: list[list[AttentionGroup]],
    dispatcher: CudagraphDispatcher,
    num_tokens: int,
    num_reqs: int | None = None,
    cudagraph_runtime_mode: CUDAGraphMode | None = None,
    uniform_decode: bool = False,
    set_lora_mapping: Callable[[np.ndarray], None] | None = None,
) -> torch.Tensor:
    """Forward `num_tokens` dummy tokens spread over `num_reqs` (default
    min(num_tokens, max_num_seqs); one token each with `uniform_decode`) fake
    requests that start at position 0.

    With `attn_groups` (a KV cache) attention runs for real with every slot
    -1, so nothing is written; with none the layers get no metadata and skip
    attention (profile run). `cudagraph_runtime_mode` FULL captures (or
    replays) the graph `dispatcher` has for exactly this size. With LoRA,
    `set_lora_mapping(num_scheduled)` maps the dummy batch to no adapter
    first. Returns the hidden states of each fake request's last token.
    """
    max_num_reqs = vllm_config.scheduler_config.max_num_seqs
    assert 0 < num_tokens <= vllm_config.scheduler_config.max_num_batched_tokens
    if uniform_decode:
        num_reqs = num_tokens
    num_reqs = num_reqs or min(num_tokens, max_num_reqs)
    assert num_reqs <= min(num_tokens, max_num_reqs)
    num_scheduled = np.full(num_reqs, num_tokens // num_reqs, dtype=np.int32)
    num_scheduled[-1] += num_tokens % num_reqs
    layout = dummy_layout(dispatcher, num_scheduled, uniform_decode, cudagraph_runtime_mode)
    if set_lora_mapping is not None:
        set_lora_mapping(num_scheduled)
    attn_metadata = None
    if attn_groups:
        attn_metadata = buffers.commit(
            layout,
            input_batch,
            attn_groups,
            for_cudagraph_capture=layout.runtime_mode != CUDAGraphMode.NONE,
        )
    else:
        buffers.commit_tokens_only(layout)
    intermediate_tensors = pp_dummy_intermediate_tensors(
        model, num_tokens, resolved_dtype(get_model_config(vllm_config)), buffers.device
    )
    with set_forward_context(
        attn_metadata,
        vllm_config,
        num_tokens=num_tokens,
        cudagraph_runtime_mode=layout.runtime_mode,
        batch_descriptor=layout.batch_descriptor,
    ):
        hidden_states = model(
            input_ids=buffers.input_ids.gpu[:num_tokens],
            positions=buffers.positions.gpu[:num_tokens],
            intermediate_tensors=intermediate_tensors,
        )
    if isinstance(hidden_states, tuple):
        # EAGLE3 drafter loaded: (last hidden states, target layers' outputs).
        hidden_states = hidden_states[0]
    last = torch.from_numpy(np.cumsum(num_scheduled) - 1).to(buffers.device)
    return hidden_states[last]


@torch.inference_mode()
def dummy_sampler_run(
    model_config: ModelConfig,
    model: TextGenerationModel,
    sampler: Sampler,
    hidden_states: torch.Tensor,
    device: torch.device,
) -> None:
    """Logits and a random top-k/top-p draw with logprobs for each row, so
    the sampler's kernels and buffers are exercised once (on the last
    pipeline stage: the others have no logits)."""
    if not get_pp_group().is_last_rank:
        return
    logits = model.compute_logits(hidden_states)
    n = logits.shape[0]
    vocab_size = model_config.get_vocab_size()
    metadata = SamplingMetadata(
        temperature=torch.full((n,), 0.5, device=device),
        all_greedy=False,
        all_random=True,
        top_p=torch.full((n,), 0.9, device=device),
        top_k=torch.full((n,), min(50, vocab_size), dtype=torch.int32, device=device),
        min_p=None,
        generators={},
        max_num_logprobs=model_config.max_logprobs,
    )
    sampler(logits, metadata)
