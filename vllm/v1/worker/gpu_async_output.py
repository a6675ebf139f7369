"""Async scheduling for the V1 model runner: the step output whose host copy
lands later, and the device-side fill of the tokens the scheduler could not
know yet.

Upstream keeps `AsyncGPUModelRunnerOutput` and `_prepare_input_ids` in
vllm/v1/worker/gpu_model_runner.py; they live here to keep that file within
the house size limit.

With async scheduling the scheduler plans step N+1 before step N's sampled
tokens are known. The runner then
  1. records a placeholder (-1) for each token sampled in step N, in the
     host token table and the request's output list (lengths stay right:
     the scheduler counts the same in-flight tokens in
     `num_output_placeholders`);
  2. keeps step N's sampled ids on the device (`InputBatch.prev_sampled_token_ids`,
     rows by `prev_req_id_to_index`) and, in step N+1, writes them over the
     placeholder input ids on the device (`scatter_prev_sampled_token_ids`);
  3. returns an `AsyncGPUModelRunnerOutput` whose `get_output()` waits for
     the side-stream device-to-host copy; the engine core calls it after it
     has scheduled the next step.
The placeholders in the output lists are resolved only when sampling reads
the values (penalties, bad words: `update_async_output_token_ids`), as upstream.
A request that leaves the batch and comes back is re-sent whole by the
scheduler (`CachedRequestData.all_token_ids`), which replaces its placeholders.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from vllm.v1.outputs import AsyncModelRunnerOutput, LogprobsTensors, ModelRunnerOutput

if TYPE_CHECKING:
    from vllm.v1.worker.gpu_input_batch import InputBatch

# The host token id of a token sampled by a step whose output is not back yet.
PLACEHOLDER_TOKEN_ID = -1


class AsyncGPUModelRunnerOutput(AsyncModelRunnerOutput):
    """A step's `ModelRunnerOutput`, completed once its host copies land.

    sampled_token_ids: [num_reqs, 1] int32 on the device; the rows in
    `invalid_req_indices` (requests mid-prefill) report no token.
    """

    def __init__(
        self,
        model_runner_output: ModelRunnerOutput,
        sampled_token_ids: torch.Tensor,
        logprobs_tensors: LogprobsTensors | None,
        invalid_req_indices: list[int],
        async_output_copy_stream: torch.cuda.Stream | None,
    ) -> None:
        self._model_runner_output = model_runner_output
        self._invalid_req_indices = invalid_req_indices
        # Keep the device tensors alive until the side-stream copies are done.
        self._sampled_token_ids = sampled_token_ids
        self._logprobs_tensors_device = logprobs_tensors
        self.async_copy_ready_event: torch.cuda.Event | None = None
        if async_output_copy_stream is None:  # host device: nothing to copy
            self.sampled_token_ids_cpu = sampled_token_ids
            self._logprobs_tensors = logprobs_tensors
            return
        default_stream = torch.cuda.current_stream()
        with torch.cuda.stream(async_output_copy_stream):
            async_output_copy_stream.wait_stream(default_stream)
            self.sampled_token_ids_cpu = sampled_token_ids.to("cpu", non_blocking=True)
            self._logprobs_tensors = (
                None
                if logprobs_tensors is None
                else LogprobsTensors(*(t.to("cpu", non_blocking=True) for t in logprobs_tensors))
            )
            self.async_copy_ready_event = torch.cuda.Event()
            self.async_copy_ready_event.record(async_output_copy_stream)

    def get_output(self) -> ModelRunnerOutput:
        if self.async_copy_ready_event is not None:
            self.async_copy_ready_event.synchronize()
        valid_sampled_token_ids: list[list[int]] = self.sampled_token_ids_cpu.tolist()
        for i in self._invalid_req_indices:
            valid_sampled_token_ids[i].clear()
        output = self._model_runner_output
        output.sampled_token_ids = valid_sampled_token_ids
        if self._logprobs_tensors is not None:
            output.logprobs = self._logprobs_tensors.tolists()
        return output


def scatter_prev_sampled_token_ids(
    batch: InputBatch,
    input_ids_np: np.ndarray,
    input_ids_gpu: torch.Tensor,
    cu_num_tokens: np.ndarray,
) -> None:
    """Write the previous step's sampled tokens over their placeholders in
    this step's device input ids (after the host ids were copied there).

    A request sampled in the previous step and scheduled again now has its
    in-flight token as its last scheduled token (one decode token, no drafts):
    flattened index cu_num_tokens[row] - 1. input_ids_np is the host copy,
    used only to check that exactly those positions hold placeholders.
    """
    prev = batch.prev_req_id_to_index
    total = int(cu_num_tokens[-1]) if len(cu_num_tokens) else 0
    placeholders = np.flatnonzero(input_ids_np[:total] == PLACEHOLDER_TOKEN_ID)
    if not prev:
        assert not len(placeholders), "placeholder input ids without a previous step"
        return
    flat_indices: list[int] = []
    prev_indices: list[int] = []
    for row, req_id in enumerate(batch.req_ids):
        prev_index = prev.get(req_id)
        if prev_index is not None:
            flat_indices.append(int(cu_num_tokens[row]) - 1)
            prev_indices.append(prev_index)
    assert sorted(flat_indices) == placeholders.tolist(), (
        "placeholder input ids do not match the previous step's sampled tokens"
    )
    if not flat_indices:
        return
    assert batch.prev_sampled_token_ids is not None
    device = input_ids_gpu.device
    dst = torch.tensor(flat_indices, dtype=torch.int64).to(device, non_blocking=True)
    src = torch.tensor(prev_indices, dtype=torch.int64).to(device, non_blocking=True)
    input_ids_gpu.index_copy_(0, dst, batch.prev_sampled_token_ids[src, 0].to(input_ids_gpu.dtype))


def update_async_output_token_ids(batch: InputBatch) -> None:
    """Replace the placeholder at the end of each row's output list with the
    token the previous step sampled there (waits for that step's host copy).
    Call before sampling in a step whose sampling reads output token values;
    each earlier placeholder was resolved in an earlier such step."""
    prev = batch.prev_req_id_to_index
    if batch.sampled_token_ids_cpu is None or not prev:
        return
    sampled: list[int] | None = None
    for row, req_id in enumerate(batch.req_ids):
        prev_index = prev.get(req_id)
        output_ids = batch.req_output_token_ids[row]
        if prev_index is None or not output_ids or output_ids[-1] != PLACEHOLDER_TOKEN_ID:
            continue
        if sampled is None:
            if batch.async_copy_ready_event is not None:
                batch.async_copy_ready_event.synchronize()
            sampled = batch.sampled_token_ids_cpu[:, 0].tolist()
        output_ids[-1] = sampled[prev_index]
