"""The bookkeeping of one `Scheduler.schedule()` call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.request import Request


@dataclass
class SchedulingStep:
    """What one scheduling step decided so far.

    `token_budget` starts at `max_num_batched_tokens` and shrinks as requests
    are scheduled; a request preempted after it was scheduled in this same
    step gives its tokens back (`unschedule`).
    """

    token_budget: int
    # time.monotonic() at the start of the step, for request events.
    timestamp: float
    # WAITING requests admitted for the first time.
    new_reqs: list[Request] = field(default_factory=list)
    # PREEMPTED requests admitted again.
    resumed_reqs: list[Request] = field(default_factory=list)
    # RUNNING requests scheduled again.
    running_reqs: list[Request] = field(default_factory=list)
    # Requests preempted in this step (they went back to the waiting queue).
    preempted_reqs: list[Request] = field(default_factory=list)
    # req_id -> number of tokens scheduled
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    # req_id -> KV blocks the workers must learn about: the newly allocated
    # ones for running requests, all of the request's blocks for admitted ones.
    req_to_new_blocks: dict[str, KVCacheBlocks] = field(default_factory=dict)
    # req_id -> the draft tokens its step verifies (running requests only).
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)

    def add(self, request: Request, num_tokens: int, blocks: KVCacheBlocks) -> None:
        """Record `num_tokens` scheduled for `request` and charge the budget."""
        assert 0 < num_tokens <= self.token_budget
        req_id = request.request_id
        self.num_scheduled_tokens[req_id] = num_tokens
        self.req_to_new_blocks[req_id] = blocks
        self.token_budget -= num_tokens

    def unschedule(self, request: Request) -> None:
        """Undo the scheduling of a running request that is being preempted.

        Its freshly allocated blocks were freed with the rest of its blocks,
        so only the step's records and the token budget need restoring.
        """
        req_id = request.request_id
        if req_id not in self.num_scheduled_tokens:
            return
        self.running_reqs.remove(request)
        self.token_budget += self.num_scheduled_tokens.pop(req_id)
        del self.req_to_new_blocks[req_id]
        # Its drafts are dropped with it (preemption clears spec_token_ids).
        self.scheduled_spec_decode_tokens.pop(req_id, None)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())
