"""The host side of the V1 runner's input preparation (upstream: the numpy
part of `_prepare_inputs` in vllm/v1/worker/gpu_model_runner.py).

`fill_step_inputs` lays the step's tokens out in the pinned host buffers of
`InputBuffers` (vllm/v1/worker/gpu_input_buffers.py); `InputBuffers.commit`
then pads them to the graph's size and copies them to the device.
`GPUModelRunner._prepare_inputs` strings the two together with the
speculative-decoding and LoRA mappings and the graph dispatch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from vllm.v1.worker.gpu_input_batch import InputBatch
from vllm.v1.worker.gpu_input_buffers import InputBuffers

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
    from vllm.v1.worker.cudagraph_padding import PaddedBatch
    from vllm.v1.worker.spec_decode_utils import SpecStep, SpeculativeDecoder


class PreparedInputs(NamedTuple):
    attn_metadata: dict[str, object]
    # [num_reqs], or [num_drafts + num_reqs] when the step verifies drafts
    logits_indices: torch.Tensor
    discard_mask: np.ndarray  # [num_reqs]
    padded: PaddedBatch  # graph mode and padded shape of the forward
    spec_step: SpecStep | None


class StepLayout(NamedTuple):
    num_scheduled: np.ndarray  # [num_reqs] int32: tokens run per request
    cu_num_tokens: np.ndarray  # [num_reqs]: cumulative sum of num_scheduled
    total: int  # tokens run this step (before any graph padding)


def fill_step_inputs(
    scheduler_output: SchedulerOutput,
    batch: InputBatch,
    bufs: InputBuffers,
    arange_np: np.ndarray,
    max_num_tokens: int,
) -> StepLayout:
    """Fill the host input buffers for the scheduled tokens, vectorised:
    positions, token ids, slot mapping, query_start_loc and seq_lens.

    Tokens are laid out request after request in batch order. For the
    example batch [req0: 3 tokens from position 5, req1: 1 token at 9]:
        req_indices = [0, 0, 0, 1]    positions = [5, 6, 7, 9]
        query_start_loc = [0, 3, 4]   seq_lens = [8, 10]
    """
    num_reqs = batch.num_reqs
    total = scheduler_output.total_num_scheduled_tokens
    assert 0 < total <= max_num_tokens
    num_scheduled = np.fromiter(
        (scheduler_output.num_scheduled_tokens[r] for r in batch.req_ids),
        dtype=np.int32,
        count=num_reqs,
    )
    cu_num_tokens = np.cumsum(num_scheduled)
    req_indices = np.repeat(arange_np[:num_reqs], num_scheduled)
    # Offset of each token inside its request: 0..n_i-1 for every request i.
    offsets = arange_np[:total] - np.repeat(cu_num_tokens - num_scheduled, num_scheduled)
    positions = bufs.positions.np[:total]
    np.add(batch.num_computed_tokens_cpu[req_indices], offsets, out=positions)

    # Token ids come from the flattened [max_num_reqs, max_model_len] buffer.
    token_indices = positions + req_indices * batch.token_ids_cpu.shape[1]
    np.take(batch.token_ids_cpu.ravel(), token_indices, out=bufs.input_ids.np[:total])
    batch.block_table.compute_slot_mapping(req_indices, positions)
    bufs.query_start_loc.np[0] = 0
    bufs.query_start_loc.np[1 : num_reqs + 1] = cu_num_tokens
    np.add(batch.num_computed_tokens_cpu[:num_reqs], num_scheduled, out=bufs.seq_lens.np[:num_reqs])
    return StepLayout(num_scheduled, cu_num_tokens, total)


def logits_indices_for_step(
    bufs: InputBuffers, num_reqs: int, spec_metadata: SpecDecodeMetadata | None
) -> torch.Tensor:
    """The hidden-state rows to compute logits for: the last scheduled token
    of every request ([num_reqs], from the device query_start_loc), or with
    drafts each drafting request's draft rows and bonus row."""
    if spec_metadata is not None:
        return spec_metadata.logits_indices
    return bufs.query_start_loc.gpu[1 : num_reqs + 1].to(torch.int64) - 1


def discard_mask_for_step(batch: InputBatch, bufs: InputBuffers) -> np.ndarray:
    """[num_reqs] bool: a request whose tokens are not all computed after this
    step is still in its prefill, so the token sampled for it is not a real
    output. (num_tokens counts no drafts: a row with drafts always samples.)"""
    num_reqs = batch.num_reqs
    return bufs.seq_lens.np[:num_reqs] < batch.num_tokens[:num_reqs]


def spec_step_and_loras(
    scheduler_output: SchedulerOutput,
    batch: InputBatch,
    layout: StepLayout,
    input_ids: np.ndarray,
    spec_decoder: SpeculativeDecoder | None,
    set_active_loras: Callable[[InputBatch, np.ndarray, np.ndarray | None], None] | None,
) -> tuple[SpecStep | None, bool]:
    """The step's drafts (with a drafter; `input_ids` [total] the step's
    host token ids) and, with LoRA (`set_active_loras` given), the token ->
    adapter and logits row -> adapter mappings (a drafting request has its
    draft rows and its bonus row); whether any adapter is active."""
    spec_step = None
    if spec_decoder is not None:
        spec_step = spec_decoder.step_inputs(
            batch,
            scheduler_output.scheduled_spec_decode_tokens,
            layout.num_scheduled,
            layout.cu_num_tokens,
            input_ids,
        )
    if set_active_loras is None:
        return spec_step, False
    num_sampled = None
    if spec_step is not None and spec_step.metadata is not None:
        num_sampled = spec_step.num_draft_tokens + 1
    set_active_loras(batch, layout.num_scheduled, num_sampled)
    return spec_step, bool(batch.lora_id_to_lora_request)
