"""Dummy batches of Model Runner V2: warm-up, memory profiling and CUDA-graph
capture (the bodies of `GPUModelRunner._dummy_run`, `_prepare_capture_batch`
and `_dummy_sampler_run`, which delegate here). No request row is touched."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from vllm.distributed import get_pp_group
from vllm.forward_context import set_forward_context
from vllm.v1.worker.gpu.attn_utils import build_dummy_attn_metadata
from vllm.v1.worker.gpu.input_batch import InputBatch
from vllm.v1.worker.gpu.sample.sampler import dummy_sample
from vllm.v1.worker.gpu.spec_decode.utils import split_model_output
from vllm.v1.worker.utils import pp_dummy_intermediate_tensors

if TYPE_CHECKING:
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor

# `runner` below is the GPUModelRunner (model_runner.py), typed Any: importing
# it here, even for types only, would make an import cycle.
GPUModelRunner = Any


def run_dummy_batch(
    runner: GPUModelRunner, num_tokens: int, use_kv_cache: bool, num_reqs: int | None
) -> torch.Tensor:
    """Forward a dummy batch (`InputBatch.make_dummy`). With `use_kv_cache`
    (and a KV cache) attention reads a zero block table and writes nothing
    (`build_dummy_attn_metadata`); otherwise the layers skip attention
    (profile run). Returns the hidden states of each fake request's last token."""
    batch = InputBatch.make_dummy(num_reqs, num_tokens, runner.input_buffers, runner.device)
    if runner.lora_config is not None:
        runner.set_dummy_loras(batch.num_scheduled_tokens)  # no adapter
    attn_metadata = (
        build_dummy_attn_metadata(runner.attn_groups, batch, runner._block_tables())
        if use_kv_cache and runner.attn_groups
        else None
    )
    model = runner._loaded_model()
    intermediate_tensors = pp_dummy_intermediate_tensors(
        model, num_tokens, runner.dtype, runner.device
    )
    with set_forward_context(attn_metadata, runner.vllm_config, num_tokens=num_tokens):
        hidden_states = model(
            input_ids=batch.input_ids,
            positions=batch.positions,
            intermediate_tensors=intermediate_tensors,
        )
    hidden_states = split_model_output(hidden_states, num_tokens)[0]  # EAGLE-3: a pair
    return hidden_states[batch.logits_indices]


def prepare_capture_batch(
    runner: GPUModelRunner, desc: BatchExecutionDescriptor
) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:
    """A dummy batch of a graph's shape, laid out where real steps put
    theirs (uniform decode graphs: one token per request)."""
    batch = InputBatch.make_dummy(
        desc.num_reqs, desc.num_tokens, runner.input_buffers, runner.device
    )
    if runner.lora_config is not None:
        # Captured with the LoRA layers, no adapter: replayed only for
        # steps without adapters (dispatch's has_lora).
        runner.set_dummy_loras(batch.num_scheduled_tokens)
    return (
        build_dummy_attn_metadata(
            runner.attn_groups, batch, runner._block_tables(), for_cudagraph_capture=True
        ),
        batch.input_ids,
        batch.positions,
    )


def dummy_sampler_run(runner: GPUModelRunner, hidden_states: torch.Tensor) -> None:
    """`dummy_sample` over the rows' logits (only the last PP stage has any)."""
    if get_pp_group().is_last_rank:
        dummy_sample(
            runner._loaded_model().compute_logits(hidden_states),
            runner.vocab_size,
            runner.model_config.max_logprobs,
        )
