"""The V1 runner's sampled tokens still in flight, under async scheduling
(upstream: `AsyncGPUModelRunnerOutput`, `_prepare_input_ids` and the async
branch of `_bookkeeping_sync` in vllm/v1/worker/gpu_model_runner.py, and
`InputBatch.update_async_output_token_ids`).

With async scheduling the scheduler plans step N+1 before step N's sampled
tokens are known. `AsyncSampledTokens`, which the runner owns, is what the
runner knows about them:
  1. `record`: a placeholder (-1) for each token sampled in step N goes into
     the host token table and the request's output list (lengths stay right:
     the scheduler counts the same in-flight tokens in
     `num_output_placeholders`); the sampled ids stay on the device, rows by
     request id, and an `AsyncGPUModelRunnerOutput` starts their host copy on a
     side stream (the engine core calls its `get_output()` after it has
     scheduled the next step);
  2. `scatter_into_input_ids`: in step N+1, the device ids are written over the
     placeholder input ids on the device;
  3. `resolve_placeholders`: the placeholders in the output lists are replaced
     only when sampling reads the values (penalties, bad words), as upstream.
A request that leaves the batch and comes back is re-sent whole by the
scheduler (`CachedRequestData.all_token_ids`), which replaces its placeholders:
`forget` drops it here.
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


class AsyncSampledTokens:
    """The previous step's sampled ids: [its num_reqs, 1] on the device, their
    host copy (valid once `copy_ready_event` fires), and req_id -> row there
    for the requests that sampled a real token (empty: nothing in flight)."""

    def __init__(self, copy_stream: torch.cuda.Stream | None) -> None:
        # Side stream for the device-to-host copies (None on a host device).
        self.copy_stream = copy_stream
        self.sampled_token_ids: torch.Tensor | None = None
        self.sampled_token_ids_cpu: torch.Tensor | None = None
        self.copy_ready_event: torch.cuda.Event | None = None
        self.req_id_to_index: dict[str, int] = {}

    def clear(self) -> None:
        """The step sampled nothing: the next one has no tokens to fill."""
        self.req_id_to_index = {}

    def forget(self, req_id: str) -> None:
        """`req_id` was re-sent whole (e.g. force-preempted while its token was
        in flight): it holds no placeholder to fill."""
        self.req_id_to_index.pop(req_id, None)

    def record(
        self,
        batch: InputBatch,
        sampled_token_ids: torch.Tensor,
        logprobs_tensors: LogprobsTensors | None,
        discard_mask: np.ndarray,
        prompt_logprobs_dict: dict[str, LogprobsTensors | None],
    ) -> AsyncGPUModelRunnerOutput:
        """Book a step's sampled ids without waiting for them: the rows not in
        `discard_mask` get placeholders, the ids stay here for the next step's
        inputs, and the returned output gets them when its host copy lands."""
        placeholders = np.full(len(discard_mask), PLACEHOLDER_TOKEN_ID, dtype=np.int32)
        rows = batch.append_sampled_tokens(placeholders, discard_mask)
        req_ids = batch.req_ids
        self.sampled_token_ids = sampled_token_ids
        self.req_id_to_index = {req_ids[row]: row for row in rows.tolist()}
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
            self.copy_stream,
        )
        self.sampled_token_ids_cpu = async_output.sampled_token_ids_cpu
        self.copy_ready_event = async_output.async_copy_ready_event
        return async_output

    def scatter_into_input_ids(
        self,
        req_ids: list[str],
        input_ids_np: np.ndarray,
        input_ids_gpu: torch.Tensor,
        cu_num_tokens: np.ndarray,
    ) -> None:
        """Write the previous step's sampled tokens over their placeholders in
        this step's device input ids (after the host ids were copied there).

        A request sampled in the previous step and scheduled again now (row i
        of `req_ids`) has its in-flight token as its last scheduled token (one
        decode token, no drafts): flattened index cu_num_tokens[i] - 1.
        input_ids_np is the host copy, used only to check that exactly those
        positions hold placeholders.
        """
        prev = self.req_id_to_index
        total = int(cu_num_tokens[-1]) if len(cu_num_tokens) else 0
        placeholders = np.flatnonzero(input_ids_np[:total] == PLACEHOLDER_TOKEN_ID)
        if not prev:
            assert not len(placeholders), "placeholder input ids without a previous step"
            return
        flat_indices: list[int] = []
        prev_indices: list[int] = []
        for row, req_id in enumerate(req_ids):
            prev_index = prev.get(req_id)
            if prev_index is not None:
                flat_indices.append(int(cu_num_tokens[row]) - 1)
                prev_indices.append(prev_index)
        assert sorted(flat_indices) == placeholders.tolist(), (
            "placeholder input ids do not match the previous step's sampled tokens"
        )
        if not flat_indices:
            return
        assert self.sampled_token_ids is not None, "tokens in flight without their ids"
        device = input_ids_gpu.device
        dst = torch.tensor(flat_indices, dtype=torch.int64).to(device, non_blocking=True)
        src = torch.tensor(prev_indices, dtype=torch.int64).to(device, non_blocking=True)
        sampled = self.sampled_token_ids[src, 0].to(input_ids_gpu.dtype)
        input_ids_gpu.index_copy_(0, dst, sampled)

    def resolve_placeholders(
        self, req_ids: list[str], req_output_token_ids: list[list[int] | None]
    ) -> None:
        """Replace the placeholder at the end of each row's output list with the
        token the previous step sampled there (waits for that step's host copy).
        Call before sampling in a step whose sampling reads output token values;
        each earlier placeholder was resolved in an earlier such step."""
        prev = self.req_id_to_index
        if self.sampled_token_ids_cpu is None or not prev:
            return
        sampled: list[int] | None = None
        for row, req_id in enumerate(req_ids):
            prev_index = prev.get(req_id)
            output_ids = req_output_token_ids[row]
            if prev_index is None or not output_ids or output_ids[-1] != PLACEHOLDER_TOKEN_ID:
                continue
            if sampled is None:
                if self.copy_ready_event is not None:
                    self.copy_ready_event.synchronize()
                sampled = self.sampled_token_ids_cpu[:, 0].tolist()
            output_ids[-1] = sampled[prev_index]
