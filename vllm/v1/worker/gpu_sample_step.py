"""Sampling and bookkeeping of the V1 runner's `sample_tokens` (upstream: `_sample`
and `_bookkeeping_sync` of vllm/v1/worker/gpu_model_runner.py, which keeps both
names as delegates), and the state `execute_model` hands to `sample_tokens`.

Without drafts every request has one logits row and gets one sampled token
([num_reqs, 1]); a request still mid-prefill (its `discard_mask` row set) has
its token dropped. Steps that verify drafts go through the rejection sampler
instead (`SpeculativeDecoder.verify`, vllm/v1/worker/spec_decode_utils.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from vllm.distributed import get_pp_group
from vllm.v1.outputs import LogprobsTensors, ModelRunnerOutput, SamplerOutput
from vllm.v1.sample.sampler import Sampler
from vllm.v1.worker.async_sampled_tokens import AsyncSampledTokens
from vllm.v1.worker.gpu_input_batch import InputBatch

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.worker.spec_decode_utils import SpecStep, SpeculativeDecoder
    from vllm.v1.worker.utils import AttentionGroup


class ExecuteModelState(NamedTuple):
    """What `execute_model` leaves for the `sample_tokens` call that follows."""

    scheduler_output: SchedulerOutput
    # [num_tokens, hidden] (for prompt logprobs); None on a pipeline stage
    # before the last, which has no logits either.
    hidden_states: torch.Tensor | None
    logits: torch.Tensor | None  # [num_reqs, vocab]
    # [num_reqs] bool: requests still mid-prefill, whose sampled token is dropped.
    discard_mask: np.ndarray
    # With a drafter: the step's drafts (logits then hold each drafting
    # request's draft rows and bonus row) and the EAGLE3 target layers' outputs.
    spec_step: SpecStep | None = None
    aux_hidden_states: list[torch.Tensor] | None = None


def sample_step(
    sampler: Sampler,
    batch: InputBatch,
    async_tokens: AsyncSampledTokens | None,
    logits: torch.Tensor,
    discard_mask: np.ndarray,
) -> SamplerOutput:
    """The sampler over the step's logits ([num_reqs, vocab]); the last
    pipeline stage sends the tokens to the earlier ones."""
    sampling_metadata = batch.sampling_metadata_for_step(discard_mask)
    if async_tokens is not None and (
        not sampling_metadata.no_penalties or sampling_metadata.bad_words_token_ids
    ):
        # Penalties and bad words read the output tokens.
        async_tokens.resolve_placeholders(batch.req_ids, batch.req_output_token_ids)
    sampler_output = sampler(logits, sampling_metadata)
    pp_group = get_pp_group()
    if pp_group.world_size > 1:
        pp_group.broadcast(
            sampler_output.sampled_token_ids.to(torch.int64).cpu(), src=pp_group.world_size - 1
        )
    return sampler_output


def bookkeeping_sync(
    batch: InputBatch,
    sampled_token_ids: torch.Tensor,
    logprobs_tensors: LogprobsTensors | None,
    discard_mask: np.ndarray,
) -> ModelRunnerOutput:
    """Append the sampled tokens ([num_reqs, 1], waited for) to the
    persistent batch and build the step's output (with async scheduling
    `AsyncSampledTokens.record` does this instead)."""
    sampled_np = sampled_token_ids[:, 0].cpu().numpy()
    rows = batch.append_sampled_tokens(sampled_np, discard_mask)
    sampled = sampled_np.tolist()
    sampled_token_ids_list: list[list[int]] = [[] for _ in sampled]
    for row in rows.tolist():
        sampled_token_ids_list[row] = [sampled[row]]
    return ModelRunnerOutput(
        req_ids=list(batch.req_ids),
        req_id_to_index=dict(batch.req_id_to_index),
        sampled_token_ids=sampled_token_ids_list,
        logprobs=logprobs_tensors.tolists() if logprobs_tensors is not None else None,
    )


def propose_drafts(
    spec_decoder: SpeculativeDecoder | None,
    batch: InputBatch,
    state: ExecuteModelState,
    sampled: list[list[int]],
    attn_groups: list[list[AttentionGroup]],
) -> None:
    """With a drafter: the next step's drafts, from the batch after this
    step's bookkeeping (`sampled`: the tokens each row emitted)."""
    if spec_decoder is None or state.spec_step is None:
        return
    assert state.hidden_states is not None
    spec_decoder.propose(
        batch,
        state.spec_step,
        sampled,
        state.hidden_states,
        state.aux_hidden_states,
        attn_groups,
    )
