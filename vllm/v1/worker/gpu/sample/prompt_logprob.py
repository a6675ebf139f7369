"""Prompt logprobs for Model Runner V2, chunk by chunk
(upstream: vllm/v1/worker/gpu/sample/prompt_logprob.py).

Prompt position i (i >= 1) gets the logprob of prompt token i under the
logits at position i - 1, plus the top-k there: P - 1 entries for a prompt of
P tokens. A step that computes prompt positions s .. s + n - 1 fills entries
s .. min(s + n, P - 1) - 1 of one preallocated CPU tensor per request, which
goes out with the step that finishes the prompt. Logprobs come from the raw
logits, without the full-vocabulary softmax (see logprob.py).

A request resumed after preemption arrives with its generated tokens in its
prefill (prefill_len > prompt_len): its prompt logprobs went out in its first
life, so it is not tracked again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from vllm.sampling_params import SamplingParams
from vllm.v1.outputs import LogprobsTensors
from vllm.v1.worker.gpu.sample.logprob import compute_topk_logprobs

if TYPE_CHECKING:
    from vllm.v1.worker.gpu.input_batch import InputBatch


class PromptLogprobsWorker:
    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        # req_id -> (top-k per position, prompt ids on the host)
        self.requests: dict[str, tuple[int, torch.Tensor]] = {}
        self.in_progress: dict[str, LogprobsTensors] = {}

    def add_request(
        self,
        req_id: str,
        prompt_token_ids: list[int],
        prefill_len: int,
        sampling_params: SamplingParams,
    ) -> None:
        num_logprobs = sampling_params.prompt_logprobs
        if num_logprobs is None or prefill_len != len(prompt_token_ids):
            return
        k = self.vocab_size if num_logprobs == -1 else num_logprobs
        self.requests[req_id] = (k, torch.tensor(prompt_token_ids, dtype=torch.int64))
        self.in_progress[req_id] = LogprobsTensors.empty_cpu(len(prompt_token_ids) - 1, k + 1)

    def remove_request(self, req_id: str) -> None:
        self.requests.pop(req_id, None)
        self.in_progress.pop(req_id, None)

    def compute_prompt_logprobs(
        self,
        compute_logits: Callable[[torch.Tensor], torch.Tensor],
        hidden_states: torch.Tensor,
        input_batch: InputBatch,
        set_logits_rows: Callable[[int, int], None] | None = None,
    ) -> dict[str, LogprobsTensors | None]:
        """req_id -> the finished prompt logprobs of the requests whose prompt
        completes in this step. hidden_states: [num_tokens, hidden] of the step.
        `set_logits_rows(i, n)` (LoRA) runs before the logits of n prompt
        positions of batch position i are computed."""
        if not self.requests:
            return {}
        batch_index = {
            req_id: i for i, req_id in enumerate(input_batch.req_ids) if req_id in self.requests
        }
        result: dict[str, LogprobsTensors | None] = {}
        for req_id, i in batch_index.items():
            k, prompt = self.requests[req_id]
            start = int(input_batch.num_computed_tokens_np[i])  # first position this step
            num_tokens = int(input_batch.num_scheduled_tokens[i])
            num_logits = min(num_tokens, prompt.shape[0] - 1 - start)
            if num_logits > 0:
                offset = int(input_batch.query_start_loc_np[i])
                if set_logits_rows is not None:
                    set_logits_rows(i, num_logits)
                logits = compute_logits(hidden_states[offset : offset + num_logits])
                targets = prompt[start + 1 : start + 1 + num_logits].to(logits.device)
                ids, values, ranks = compute_topk_logprobs(logits.to(torch.float32), k, targets)
                tensors = self.in_progress[req_id]
                tensors.logprob_token_ids[start : start + num_logits].copy_(ids)
                tensors.logprobs[start : start + num_logits].copy_(values)
                tensors.selected_token_ranks[start : start + num_logits].copy_(ranks)
            if start + num_tokens >= prompt.shape[0]:  # the prompt is complete
                result[req_id] = self.in_progress[req_id]
                self.remove_request(req_id)
        return result
