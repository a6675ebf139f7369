"""Speculative decoding under async scheduling in the V1 runner (upstream: the
`prev_num_draft_len` correction of `_update_states`, `valid_sampled_token_count`
and the drafts kept on the device for `_prepare_input_ids`, in
vllm/v1/worker/gpu_model_runner.py).

With async scheduling the scheduler plans step N+1 before step N's output
reaches it (vllm/v1/core/sched/async_scheduler.py), so for a request that
verified drafts in step N it
  - sends `num_computed_tokens` as if every draft of step N was accepted
    (it takes the rejected ones back only when step N's output arrives), and
  - schedules k placeholder drafts (-1): the drafts proposed after step N
    never travel to the scheduler.
The runner knows the truth (it verified step N and proposed its drafts), and
`AsyncSpecDrafts` holds what it needs to mend step N+1's inputs:
  - per request of the last step that ran: the optimistic computed-token
    count the scheduler will send and the number of drafts it rejected;
  - per request: the drafts proposed for its next step.
The device here is the host, so these are host lists; the V1 runner appends
each step's emitted tokens to its batch at once (as with sync scheduling),
so the input ids of step N+1 are the real tokens followed by the drafts.

Which steps have been processed by the time step N+1 is scheduled depends on
the engine core's batch queue (two steps in flight at most, so every step
before N has been): the scheduler's count is either the optimistic one
(step N not processed yet) or the corrected one. `corrected_num_computed`
tells them apart by value, which is unambiguous whenever there is something
to correct (a rejected draft makes the two differ).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from vllm.v1.outputs import DraftTokenIds

if TYPE_CHECKING:
    from vllm.v1.worker.spec_decode_utils import SpecStep

# The draft id put where the runner proposed fewer drafts than the scheduler
# plans (k; e.g. none at max_model_len). Any id is safe: the rejection
# sampler verifies it like any other draft (greedy: accepted only if it is
# the target's argmax), and the scheduler's grammar check sees the same id.
FILLER_DRAFT_TOKEN_ID = 0


class _LastStep(NamedTuple):
    # num_computed_tokens + scheduled tokens (drafts included) of the step:
    # what the scheduler counts until the step's output reaches it.
    optimistic_num_computed: int
    num_rejected: int  # drafts of the step the rejection sampler rejected


class AsyncSpecDrafts:
    """The V1 runner's speculative-decoding state under async scheduling."""

    def __init__(self) -> None:
        self._last_step: dict[str, _LastStep] = {}
        self._drafts: dict[str, list[int]] = {}

    def corrected_num_computed(self, req_id: str, num_computed: int) -> int:
        """The real computed-token count of a request that stays in the batch
        from the last step, given the scheduler's `num_computed`."""
        last = self._last_step.get(req_id)
        if last is None or last.num_rejected == 0:
            return num_computed
        if num_computed == last.optimistic_num_computed:
            return num_computed - last.num_rejected
        # The scheduler processed the step's output already: it took the
        # rejected drafts back itself.
        assert num_computed == last.optimistic_num_computed - last.num_rejected, (
            f"request {req_id}: the scheduler's num_computed_tokens {num_computed} is "
            f"neither {last.optimistic_num_computed} nor that minus {last.num_rejected} "
            "rejected drafts"
        )
        return num_computed

    def remove(self, req_id: str) -> None:
        """A finished request."""
        self._last_step.pop(req_id, None)
        self._drafts.pop(req_id, None)

    def real_spec_tokens(self, scheduled: dict[str, list[int]]) -> dict[str, list[int]]:
        """The scheduled placeholder drafts replaced by the runner's own: the
        first n of those kept for the request (n scheduled: the budget may
        have cut them)."""
        real: dict[str, list[int]] = {}
        for req_id, placeholders in scheduled.items():
            n = len(placeholders)
            drafts = self._drafts.get(req_id, [])[:n]
            real[req_id] = drafts + [FILLER_DRAFT_TOKEN_ID] * (n - len(drafts))
        return real

    def draft_token_ids(self) -> DraftTokenIds:
        """Every request's kept drafts (for the scheduler's grammar bitmask:
        EngineCore takes them for a structured-output step)."""
        return DraftTokenIds(list(self._drafts), [list(d) for d in self._drafts.values()])

    def record_step(
        self,
        req_ids: list[str],
        step: SpecStep,
        sampled: list[list[int]],
        proposed: DraftTokenIds | None,
        num_spec_tokens: int,
    ) -> None:
        """After the step's verification and proposal: each row's optimistic
        count and rejections (a row that emitted t tokens accepted t - 1 of
        its drafts), and the drafts for its next step, filled up to
        `num_spec_tokens` (the scheduler plans that many) for a row that
        emitted, none for a row mid-prefill."""
        last: dict[str, _LastStep] = {}
        drafts_by_req = dict(zip(proposed.req_ids, proposed.draft_token_ids)) if proposed else {}
        for row, req_id in enumerate(req_ids):
            num_drafts = int(step.num_draft_tokens[row])
            num_rejected = num_drafts - (len(sampled[row]) - 1) if sampled[row] else 0
            optimistic = int(step.num_computed_tokens[row] + step.num_scheduled_tokens[row])
            last[req_id] = _LastStep(optimistic, num_rejected)
            if not sampled[row]:
                self._drafts.pop(req_id, None)
                continue
            drafts = list(drafts_by_req.get(req_id, ()))[:num_spec_tokens]
            fill = [FILLER_DRAFT_TOKEN_ID] * (num_spec_tokens - len(drafts))
            self._drafts[req_id] = drafts + fill
        self._last_step = last
