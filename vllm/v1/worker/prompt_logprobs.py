"""Prompt logprobs for the V1 model runner, chunk by chunk (upstream:
`_get_prompt_logprobs_dict` of vllm/v1/worker/gpu_model_runner.py; shaped as
V2's vllm/v1/worker/gpu/sample/prompt_logprob.py).

Prompt position i (i >= 1) gets the logprob of prompt token i under the
logits the model produced at position i - 1, plus the top-k there. A prompt
of P tokens therefore has P - 1 entries. With chunked prefill a chunk of n
tokens starting at position s yields entries s .. s + n - 1 (clipped to
P - 2), written into one preallocated CPU tensor per request; the tensor is
returned with the step that finishes the prompt.

A request is tracked from its arrival until its prompt is done (or it
finishes): leaving the batch for a step or being preempted mid-prompt does
not lose the entries filled so far, and a request resumed after its prompt
was done is not tracked again (its prompt logprobs went out already).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch

from vllm.v1.outputs import LogprobsTensors
from vllm.v1.sample.sampler import Sampler

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.worker.gpu_input_batch import InputBatch


class PromptLogprobsWorker:
    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        # req_id -> (top-k per position, prompt token ids)
        self.requests: dict[str, tuple[int, list[int]]] = {}
        # req_id -> the entries filled so far
        self.in_progress: dict[str, LogprobsTensors] = {}

    def add_request(
        self, req_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams
    ) -> None:
        num_logprobs = sampling_params.prompt_logprobs
        if num_logprobs is None:
            return
        k = self.vocab_size if num_logprobs == -1 else num_logprobs
        self.requests[req_id] = (k, prompt_token_ids)

    def remove_request(self, req_id: str) -> None:
        self.requests.pop(req_id, None)
        self.in_progress.pop(req_id, None)

    def compute_prompt_logprobs(
        self,
        compute_logits: Callable[[torch.Tensor], torch.Tensor],
        hidden_states: torch.Tensor,
        input_batch: InputBatch,
        query_start_loc: np.ndarray,
        num_scheduled_tokens: Mapping[str, int],
        set_logits_rows: Callable[[int, int], None] | None = None,
    ) -> dict[str, LogprobsTensors | None]:
        """req_id -> the finished prompt logprobs, for requests whose prompt
        completes in this step. hidden_states: [num_tokens, hidden] of the
        step; query_start_loc: [num_reqs + 1] token offsets of the batch rows.
        `set_logits_rows(row, n)` (LoRA) runs before the logits of n prompt
        positions of batch row `row` are computed."""
        if not self.requests:
            return {}
        result: dict[str, LogprobsTensors | None] = {}
        for req_id, row in input_batch.req_id_to_index.items():
            tracked = self.requests.get(req_id)
            num_tokens = num_scheduled_tokens.get(req_id)
            if tracked is None or num_tokens is None:
                continue
            k, prompt = tracked
            tensors = self.in_progress.get(req_id)
            if tensors is None:
                tensors = LogprobsTensors.empty_cpu(len(prompt) - 1, k + 1)
                self.in_progress[req_id] = tensors
            # First position computed in this step.
            start = int(input_batch.num_computed_tokens_cpu[row])
            num_logits = min(num_tokens, len(prompt) - (start + 1))
            if num_logits > 0:
                offset = int(query_start_loc[row])
                if set_logits_rows is not None:
                    set_logits_rows(row, num_logits)
                logits = compute_logits(hidden_states[offset : offset + num_logits])
                targets = torch.from_numpy(
                    np.asarray(prompt[start + 1 : start + 1 + num_logits], dtype=np.int64)
                )
                logprobs = Sampler.compute_logprobs(logits)
                ids, values, ranks = Sampler.gather_logprobs(logprobs, k, targets.to(logits.device))
                end = start + num_logits
                tensors.logprob_token_ids[start:end].copy_(ids, non_blocking=True)
                tensors.logprobs[start:end].copy_(values, non_blocking=True)
                tensors.selected_token_ranks[start:end].copy_(ranks, non_blocking=True)
            if start + num_tokens >= len(prompt):  # the prompt's last chunk
                result[req_id] = tensors
                self.remove_request(req_id)
        if result and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the copies above are asynchronous
        return result
