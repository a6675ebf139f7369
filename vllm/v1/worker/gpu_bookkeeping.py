"""What the V1 model runner does with a step's sampled tokens (upstream: the
`_bookkeeping_sync` part of `_sample` / `_bookkeeping` and the async branch
of vllm/v1/worker/gpu_model_runner.py; functions here to keep the runner
within the house size limit).

Every row that finished its prompt (not in `discard_mask`, i.e. not still
mid-prefill) gets one token appended, in the host token table and in the
request's output list. Synchronously that is the sampled token; with async
scheduling it is a placeholder, replaced on the device in the next step's
inputs (see vllm/v1/worker/gpu_async_output.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from vllm.v1.outputs import LogprobsTensors, ModelRunnerOutput
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.worker.gpu_async_output import PLACEHOLDER_TOKEN_ID, AsyncGPUModelRunnerOutput
from vllm.v1.worker.gpu_input_batch import InputBatch


def sampling_metadata_for_step(batch: InputBatch, discard_mask: np.ndarray) -> SamplingMetadata:
    """The batch's sampling metadata, minus the generators of requests
    still mid-prefill: their draw is discarded, so it must not advance
    their generator (seeded output must not depend on chunking)."""
    metadata = batch.sampling_metadata
    generators = metadata.generators
    if generators and discard_mask.any():
        kept = {row: g for row, g in generators.items() if not discard_mask[row]}
        metadata = dataclasses.replace(metadata, generators=kept)
    return metadata


def append_sampled_tokens(
    batch: InputBatch, token_ids: np.ndarray, discard_mask: np.ndarray
) -> np.ndarray:
    """Append token_ids[row] to every row not in `discard_mask`, in the token
    table and the request's output list; returns those rows."""
    rows = np.flatnonzero(~discard_mask)
    # Write the new tokens after each row's last token, all rows at once.
    cols = batch.num_tokens[rows]
    fits = cols < batch.max_model_len
    batch.token_ids_cpu[rows[fits], cols[fits]] = token_ids[rows[fits]]
    batch.num_tokens[rows] += 1
    output_lists = batch.req_output_token_ids
    values = token_ids.tolist()
    for row in rows.tolist():
        output_lists[row].append(values[row])  # type: ignore[union-attr]
    return rows


def bookkeeping_sync(
    batch: InputBatch,
    sampled_token_ids: torch.Tensor,
    logprobs_tensors: LogprobsTensors | None,
    discard_mask: np.ndarray,
) -> ModelRunnerOutput:
    """Append the sampled tokens ([num_reqs, 1] int32, waited for) and build
    the step's output."""
    sampled_np = sampled_token_ids[:, 0].cpu().numpy()
    rows = append_sampled_tokens(batch, sampled_np, discard_mask)
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


def bookkeeping_async(
    batch: InputBatch,
    sampled_token_ids: torch.Tensor,
    logprobs_tensors: LogprobsTensors | None,
    discard_mask: np.ndarray,
    prompt_logprobs_dict: dict[str, LogprobsTensors | None],
    async_output_copy_stream: torch.cuda.Stream | None,
) -> AsyncGPUModelRunnerOutput:
    """As `bookkeeping_sync`, without waiting for the sampled ids: the rows
    get placeholders, the batch keeps the ids on the device for the next
    step's inputs, and the output gets them when its host copy lands."""
    placeholders = np.full(len(discard_mask), PLACEHOLDER_TOKEN_ID, dtype=np.int32)
    rows = append_sampled_tokens(batch, placeholders, discard_mask)
    req_ids = batch.req_ids
    batch.prev_sampled_token_ids = sampled_token_ids
    batch.prev_req_id_to_index = {req_ids[row]: row for row in rows.tolist()}
    output = ModelRunnerOutput(
        req_ids=list(req_ids),
        req_id_to_index=dict(batch.req_id_to_index),
        prompt_logprobs_dict=prompt_logprobs_dict,
    )
    async_output = AsyncGPUModelRunnerOutput(
        output,
        sampled_token_ids,
        logprobs_tensors,
        np.flatnonzero(discard_mask).tolist(),
        async_output_copy_stream,
    )
    batch.sampled_token_ids_cpu = async_output.sampled_token_ids_cpu
    batch.async_copy_ready_event = async_output.async_copy_ready_event
    return async_output
