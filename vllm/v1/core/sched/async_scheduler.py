"""The scheduler for async scheduling (upstream:
vllm/v1/core/sched/async_scheduler.py).

With async scheduling the engine core schedules step N+1 while step N still
runs, so a decoding request is scheduled again before the token it is
sampling in step N is known. Each such in-flight token is counted in
`request.num_output_placeholders`:

    step N scheduled   -> placeholders += 1  (_update_after_schedule)
    step N's output in -> placeholders -= 1  (_update_request_with_output)

With speculative decoding a step that verifies k drafts emits up to k + 1
tokens: it adds 1 + k placeholders; its output removes one per token emitted
and one per rejected draft (_rollback_rejected_drafts). The drafts themselves
are not known when the next step is scheduled: the request carries k
placeholder drafts (-1), which the runner replaces with its own proposals.

The base scheduler already counts placeholders as tokens to compute
(`num_tokens_with_spec + num_output_placeholders - num_computed_tokens` is 1
for a decoding request with one step in flight) and refuses to schedule a
request whose steps in flight already reach max_tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput


class AsyncScheduler(Scheduler):
    """A Scheduler that tracks the output tokens of the steps in flight."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # req_id -> number of in-flight output tokens to throw away: those of
        # requests force-preempted by reset_prefix_cache, which restart from
        # their known tokens and would otherwise get the stale token too.
        self._num_async_tokens_to_discard: dict[str, int] = {}
        # Read-only placeholder drafts, shared by every request.
        self._spec_token_placeholders: list[int] = [-1] * self.spec_decode.num_spec_tokens

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        super()._update_after_schedule(scheduler_output)
        spec_decode_tokens = scheduler_output.scheduled_spec_decode_tokens
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.requests[req_id]
            # A step that reached the end of the known tokens (last prefill
            # chunk, or a decode step) samples tokens whose values arrive only
            # with its output; a mid-prompt chunk samples nothing.
            if request.is_prefill_chunk:
                continue
            request.num_output_placeholders += 1 + len(spec_decode_tokens.get(req_id, ()))
            request.spec_token_ids = self._spec_token_placeholders

    def _rollback_rejected_drafts(self, request: Request, num_rejected: int) -> None:
        req_id = request.request_id
        num_to_discard = self._num_async_tokens_to_discard.get(req_id, 0)
        if num_to_discard > 0:
            # A stale step (forced preemption): its placeholders were dropped
            # and its slots counted as tokens to discard, rejected drafts too.
            self._set_tokens_to_discard(req_id, num_to_discard - num_rejected)
            return
        request.num_output_placeholders -= num_rejected
        if request.status == RequestStatus.RUNNING:
            # (A request preempted meanwhile restarts from 0 computed tokens.)
            super()._rollback_rejected_drafts(request, num_rejected)

    def _update_request_with_output(
        self, request: Request, new_token_ids: list[int]
    ) -> tuple[list[int], bool]:
        num_to_discard = self._num_async_tokens_to_discard.get(request.request_id, 0)
        if num_to_discard > 0:
            # A stale token from before a forced preemption.
            self._set_tokens_to_discard(request.request_id, num_to_discard - len(new_token_ids))
            return [], False

        status_before_update = request.status
        new_token_ids, stopped = super()._update_request_with_output(request, new_token_ids)
        request.num_output_placeholders -= len(new_token_ids)
        assert request.num_output_placeholders >= 0
        if status_before_update == RequestStatus.RUNNING:
            # allocate_slots could only hash (and cache) blocks of known
            # tokens; now that the new tokens are known, cache the blocks
            # they completed. A preempted request has no blocks to cache.
            self.kv_cache_manager.cache_blocks(
                request, request.num_computed_tokens - request.num_output_placeholders
            )
        return new_token_ids, stopped

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        if reset_running_requests:
            for request in self.running:
                if request.num_output_placeholders > 0:
                    self._set_tokens_to_discard(request.request_id, request.num_output_placeholders)
                    request.num_output_placeholders = 0
        return super().reset_prefix_cache(reset_running_requests)

    def _free_request(self, request: Request) -> None:
        self._num_async_tokens_to_discard.pop(request.request_id, None)
        super()._free_request(request)

    def _set_tokens_to_discard(self, req_id: str, num_tokens: int) -> None:
        if num_tokens > 0:
            self._num_async_tokens_to_discard[req_id] = num_tokens
        else:
            self._num_async_tokens_to_discard.pop(req_id, None)
