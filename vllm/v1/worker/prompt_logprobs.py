"""Prompt logprobs, chunk by chunk (upstream: `_get_prompt_logprobs_dict` of
vllm/v1/worker/gpu_model_runner.py).

Prompt position i (i >= 1) gets the logprob of prompt token i under the
logits the model produced at position i - 1, plus the top-k there. A prompt
of P tokens therefore has P - 1 entries. With chunked prefill a chunk of n
tokens starting at position s yields entries s .. s + n - 1 (clipped to
P - 2), written into one preallocated CPU tensor per request; the tensor is
returned with the step that finishes the prompt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from vllm.v1.outputs import LogprobsTensors

if TYPE_CHECKING:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner


def get_prompt_logprobs_dict(
    runner: GPUModelRunner, hidden_states: torch.Tensor, num_scheduled_tokens: dict[str, int]
) -> dict[str, LogprobsTensors | None]:
    """req_id -> the finished prompt logprobs, for requests whose prompt
    completes in this step. hidden_states: [num_tokens, hidden] of the step."""
    batch = runner.input_batch
    pending = batch.num_prompt_logprobs
    if not pending:
        return {}
    in_progress = runner.in_progress_prompt_logprobs
    query_start_loc = runner.query_start_loc.np
    result: dict[str, LogprobsTensors | None] = {}
    completed: list[str] = []
    for req_id, num_logprobs in pending.items():
        num_tokens = num_scheduled_tokens.get(req_id)
        if num_tokens is None:  # not scheduled this step
            continue
        req = runner.requests[req_id]
        k = runner.vocab_size if num_logprobs == -1 else num_logprobs
        tensors = in_progress.get(req_id)
        if tensors is None:
            tensors = LogprobsTensors.empty_cpu(req.num_prompt_tokens - 1, k + 1)
            in_progress[req_id] = tensors
        start = req.num_computed_tokens  # first position computed in this step
        num_remaining = req.num_prompt_tokens - (start + 1)
        if num_tokens <= num_remaining:
            num_logits = num_tokens
        else:  # the prompt's last chunk
            num_logits = num_remaining
            completed.append(req_id)
            result[req_id] = tensors
        if num_logits <= 0:
            continue
        offset = int(query_start_loc[batch.req_id_to_index[req_id]])
        logits = runner.get_model().compute_logits(hidden_states[offset : offset + num_logits])
        targets = torch.from_numpy(
            np.asarray(req.prompt_token_ids[start + 1 : start + 1 + num_logits], dtype=np.int64)
        )
        logprobs = runner.sampler.compute_logprobs(logits)
        ids, values, ranks = runner.sampler.gather_logprobs(logprobs, k, targets.to(logits.device))
        tensors.logprob_token_ids[start : start + num_logits].copy_(ids, non_blocking=True)
        tensors.logprobs[start : start + num_logits].copy_(values, non_blocking=True)
        tensors.selected_token_ranks[start : start + num_logits].copy_(ranks, non_blocking=True)
    for req_id in completed:
        del pending[req_id]
        del in_progress[req_id]
    if result and runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)  # the copies above are asynchronous
    return result
