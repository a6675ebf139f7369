"""The scheduler's side of speculative decoding (upstream: inline in
vllm/v1/core/sched/scheduler.py).

Life of a request's drafts, in sync scheduling:

    step N runs   -> the runner proposes drafts for each request that sampled
    post_step     -> EngineCore takes them (executor.take_draft_token_ids) and
                     hands them to update_draft_token_ids: request.spec_token_ids
    schedule N+1  -> num_tokens_with_spec counts them; the part of them that
                     fits the step (token budget, max_model_len) goes into
                     scheduled_spec_decode_tokens; spec_token_ids is cleared
    output N+1    -> the runner verified them: it returns the accepted drafts
                     plus one token of its own; the rejected ones are taken
                     back from num_computed_tokens (their KV slots are
                     overwritten by the next step)

In async scheduling (AsyncScheduler) the drafts never reach the scheduler:
it schedules k placeholders (-1) per request and the runner uses its own
drafts (vllm/v1/worker/async_spec_decode.py). Only a step that needs the
drafts' values here - a structured-output request's grammar bitmask - fetches
them first (EngineCore -> update_draft_token_ids_in_output).

Only real tokens are ever cached by the prefix cache: allocate_slots caches
at most `request.num_tokens` tokens, which excludes drafts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm.v1.spec_decode.metrics import SpecDecodingStats

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.scheduling_step import SchedulingStep
    from vllm.v1.outputs import DraftTokenIds
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager


def num_speculative_tokens(vllm_config: VllmConfig) -> int:
    """Drafts per request per step (0 without speculative decoding)."""
    spec = vllm_config.speculative_config
    if spec is None or spec.num_speculative_tokens is None:
        return 0
    return spec.num_speculative_tokens


def num_lookahead_tokens(vllm_config: VllmConfig) -> int:
    """KV slots to reserve past the scheduled tokens (upstream:
    VllmConfig.num_lookahead_tokens): a drafter with its own KV cache (draft
    model, EAGLE family) writes KV for the positions of the drafts it
    proposes after the step; n-gram drafting writes none."""
    spec = vllm_config.speculative_config
    if spec is None:
        return 0
    if spec.use_dflash():
        # One query for the last sampled token plus one per draft.
        return num_speculative_tokens(vllm_config) + 1
    if spec.use_eagle() or spec.uses_draft_model():
        return num_speculative_tokens(vllm_config)
    return 0


def num_scheduled_drafts(request: Request, num_new_tokens: int) -> int:
    """How many of `request.spec_token_ids` a step of `num_new_tokens`
    tokens covers: the tokens past the request's known ones (placeholders of
    async steps in flight excluded). A step cut short by the token budget or
    max_model_len covers only a prefix of the drafts."""
    return (
        num_new_tokens
        + request.num_computed_tokens
        - request.num_tokens
        - request.num_output_placeholders
    )


class SpecDecodeScheduling:
    """Draft bookkeeping of one scheduler: which drafts a step verifies, the
    rollback of rejected ones, new drafts in, and the per-step stats."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        structured_output_manager: StructuredOutputManager,
        log_stats: bool,
    ) -> None:
        self.num_spec_tokens = num_speculative_tokens(vllm_config)
        self.num_lookahead_tokens = num_lookahead_tokens(vllm_config)
        self.structured_output_manager = structured_output_manager
        self.log_stats = log_stats
        # The drafts verified since the last take_stats().
        self._stats: SpecDecodingStats | None = None

    def schedule_drafts(self, request: Request, num_new_tokens: int, step: SchedulingStep) -> None:
        """Record the drafts a running request's step verifies in
        `step.scheduled_spec_decode_tokens` and clear them from the request:
        the runner proposes new ones after the step."""
        if not request.spec_token_ids:
            return
        n = num_scheduled_drafts(request, num_new_tokens)
        if n > 0:
            step.scheduled_spec_decode_tokens[request.request_id] = request.spec_token_ids[:n]
        request.spec_token_ids = []

    def num_rejected(
        self,
        request: Request,
        scheduled_drafts: list[int] | None,
        generated: list[int],
        num_invalid: int = 0,
    ) -> int:
        """The drafts of `request`'s step that the runner rejected, given the
        tokens it generated (accepted drafts + one of its own); counts them in
        the stats, less the `num_invalid` ones its grammar ruled out before
        verification (as upstream). 0 when the step verified no drafts or
        sampled nothing."""
        if not scheduled_drafts or not generated:
            return 0
        num_drafts = len(scheduled_drafts)
        num_accepted = len(generated) - 1
        if not 0 <= num_accepted <= num_drafts:
            raise RuntimeError(
                f"Request {request.request_id}: {len(generated)} tokens generated for a "
                f"step with {num_drafts} draft tokens (at most {num_drafts + 1})"
            )
        if self.log_stats and num_drafts > num_invalid:
            if self._stats is None:
                self._stats = SpecDecodingStats.new(self.num_spec_tokens)
            self._stats.observe_draft(num_drafts - num_invalid, num_accepted)
        return num_drafts - num_accepted

    def take_stats(self) -> SpecDecodingStats | None:
        stats, self._stats = self._stats, None
        return stats

    def update_draft_token_ids(
        self, requests: dict[str, Request], draft_token_ids: DraftTokenIds
    ) -> None:
        """Give each request its new drafts (sync scheduling). Skipped: unknown
        or finished requests, and requests whose last step was a prompt chunk
        (it sampled nothing to draft from). A structured-output request keeps
        only the prefix of its drafts that its grammar accepts."""
        for req_id, spec_token_ids in zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids):
            request = requests.get(req_id)
            if request is None or request.is_finished():
                continue
            if request.is_prefill_chunk:
                request.spec_token_ids = []
                continue
            request.spec_token_ids = self._grammar_valid_prefix(request, list(spec_token_ids))

    def update_draft_token_ids_in_output(
        self,
        requests: dict[str, Request],
        draft_token_ids: DraftTokenIds,
        scheduler_output: SchedulerOutput,
    ) -> None:
        """Async scheduling: a scheduled step carries placeholder drafts; put
        the runner's real ones (the first n, n scheduled) in their place so
        the grammar bitmask can follow them. A structured-output request's
        drafts past its grammar's valid prefix become -1 (the bitmask skips
        them; the runner's own copy of such a draft gets masked out and
        rejected), counted in `scheduler_output.num_invalid_spec_tokens`."""
        scheduled = scheduler_output.scheduled_spec_decode_tokens
        num_invalid: dict[str, int] = {}
        for req_id, spec_token_ids in zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids):
            request = requests.get(req_id)
            placeholders = scheduled.get(req_id)
            if request is None or request.is_finished() or not placeholders:
                continue
            n = len(placeholders)
            valid = self._grammar_valid_prefix(request, list(spec_token_ids[:n]))
            if len(valid) < n:
                num_invalid[req_id] = n - len(valid)
            scheduled[req_id] = valid + [-1] * (n - len(valid))
        scheduler_output.num_invalid_spec_tokens = num_invalid

    def _grammar_valid_prefix(self, request: Request, spec_token_ids: list[int]) -> list[int]:
        if not spec_token_ids or not self.structured_output_manager.should_advance(request):
            return spec_token_ids
        so_request = request.structured_output_request
        assert so_request is not None and so_request.grammar is not None
        return so_request.grammar.validate_tokens(spec_token_ids)
