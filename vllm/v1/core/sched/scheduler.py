"""The V1 scheduler (upstream: vllm/v1/core/sched/scheduler.py).

Per step, the engine core calls `schedule()`, runs the batch, then hands the
model runner's output to `update_from_output()`. The scheduler owns the
requests, the waiting queue and running list, and the KV cache manager.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING

from vllm.logger import init_logger
from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
from vllm.v1.core.sched.interface import SchedulerInterface
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.core.sched.output_builder import (
    make_cached_request_data,
    make_engine_core_outputs,
    make_new_reqs_data,
)
from vllm.v1.core.sched.request_queue import SchedulingPolicy, create_request_queue
from vllm.v1.core.sched.scheduling_step import SchedulingStep
from vllm.v1.core.sched.spec_decode import SpecDecodeScheduling
from vllm.v1.core.sched.structured_output import StructuredOutputScheduling
from vllm.v1.core.sched.utils import (
    check_stop,
    exceeds_max_loras,
    pop_preemption_victim,
    remove_all,
    running_lora_ids,
)
from vllm.v1.engine import EngineCoreEventType, EngineCoreOutput, EngineCoreOutputs
from vllm.v1.kv_cache_interface import get_max_in_flight_tokens, get_max_model_len
from vllm.v1.metrics.stats import SchedulerStats
from vllm.v1.request import Request, RequestStatus

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
    from vllm.v1.spec_decode.metrics import SpecDecodingStats
    from vllm.v1.structured_output import StructuredOutputManager

logger = init_logger(__name__)


class Scheduler(SchedulerInterface):
    """Continuous-batching scheduler with chunked prefill, prefix caching and
    recompute-style preemption, under one token budget per step."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        kv_cache_config: KVCacheConfig,
        structured_output_manager: StructuredOutputManager,
        block_size: int | None = None,
        hash_block_size: int | None = None,
        include_finished_set: bool = False,
        log_stats: bool = False,
    ) -> None:
        self.vllm_config = vllm_config
        self.scheduler_config = vllm_config.scheduler_config
        self.cache_config = vllm_config.cache_config
        self.parallel_config = vllm_config.parallel_config
        self.lora_config = vllm_config.lora_config
        self.kv_cache_config = kv_cache_config
        self.structured_output_manager = structured_output_manager
        self.log_stats = log_stats

        # With include_finished_set, every EngineCoreOutputs also lists the
        # requests of its client that finished since the last output (the
        # multi-engine front-ends track request lifetimes with it).
        self.finished_req_ids_dict: dict[int, set[str]] | None = (
            defaultdict(set) if include_finished_set else None
        )
        # Requests scheduled in the previous step (V1 runner: the others
        # were dropped from its persistent batch and need all their tokens).
        self.prev_step_scheduled_req_ids: set[str] = set()
        # Preempted outside schedule() (reset_prefix_cache with running
        # requests): the next output tells the workers (V2 frees their rows).
        self.preempted_outside_schedule: set[str] = set()

        self.max_num_running_reqs = self.scheduler_config.max_num_seqs
        self.max_num_scheduled_tokens = self.scheduler_config.max_num_batched_tokens
        self.max_model_len = get_max_model_len(vllm_config)
        self.block_size = block_size or self.cache_config.block_size

        # req_id -> Request, for every unfinished request.
        self.requests: dict[str, Request] = {}
        try:
            self.policy = SchedulingPolicy(self.scheduler_config.policy)
        except ValueError as e:
            raise ValueError(f"Unknown scheduling policy: {self.scheduler_config.policy}") from e
        self.waiting = create_request_queue(self.policy)
        self.running: list[Request] = []
        # Requests finished since the last schedule(); the next
        # SchedulerOutput tells the workers to drop their state.
        self.finished_req_ids: set[str] = set()
        self.structured_output = StructuredOutputScheduling(
            structured_output_manager, self._free_request
        )

        self.kv_cache_manager = KVCacheManager(
            kv_cache_config=kv_cache_config,
            max_model_len=self.max_model_len,
            scheduler_block_size=self.block_size,
            hash_block_size=hash_block_size or self.block_size,
            max_in_flight_tokens=get_max_in_flight_tokens(vllm_config),
            enable_caching=self.cache_config.enable_prefix_caching,
            log_stats=self.log_stats,
            watermark=self.scheduler_config.watermark,
        )
        self.use_pp = self.parallel_config.pipeline_parallel_size > 1
        # Model Runner V2 wants resumed requests re-sent whole (see
        # output_builder.make_new_reqs_data); V1 patches its persistent batch instead.
        self.use_v2_model_runner = vllm_config.use_v2_model_runner
        self.spec_decode = SpecDecodeScheduling(vllm_config, structured_output_manager, log_stats)
        self.num_lookahead_tokens = self.spec_decode.num_lookahead_tokens

    # ------------------------------------------------------------------
    # schedule()
    # ------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        # On the scheduling algorithm: there is no "prefill phase" and no
        # "decode phase". Each request has num_computed_tokens (tokens whose
        # KV is, or is being, computed) and num_tokens_with_spec (prompt +
        # outputs + speculative tokens). Every step hands out at most
        # max_num_batched_tokens tokens so that each request's
        # num_computed_tokens catches up with its num_tokens_with_spec. A
        # prompt larger than the budget is thereby prefilled in chunks, a
        # prefix-cache hit simply starts num_computed_tokens higher, and a
        # decoding request asks for one token.
        #
        # RUNNING requests go first, in order; when the KV cache is full a
        # running request is preempted to make room. WAITING requests are
        # admitted afterwards, only if nothing was preempted in this step.
        step = SchedulingStep(
            token_budget=self.max_num_scheduled_tokens, timestamp=time.monotonic()
        )
        self._schedule_running(step)
        if not step.preempted_reqs:
            self._schedule_waiting(step)

        assert step.token_budget >= 0
        assert step.total_num_scheduled_tokens <= self.max_num_scheduled_tokens
        assert len(self.running) <= self.max_num_running_reqs
        scheduler_output = self._make_scheduler_output(step)
        self._update_after_schedule(scheduler_output)
        return scheduler_output

    def _schedule_running(self, step: SchedulingStep) -> None:
        req_index = 0
        while req_index < len(self.running) and step.token_budget > 0:
            request = self.running[req_index]
            num_new_tokens = self._num_new_tokens_running(request, step.token_budget)
            if num_new_tokens == 0:
                # Nothing to compute now (async scheduling: the tokens in
                # flight already reach max_tokens or max_model_len). `continue`
                # rather than `break`: later requests may still run.
                req_index += 1
                continue

            num_preempted = len(step.preempted_reqs)
            new_blocks = self._allocate_running(request, num_new_tokens, step)
            if new_blocks is None:
                # The request had to preempt itself: the cache cannot hold it.
                break
            if len(step.preempted_reqs) != num_preempted:
                # Priority preemption may have removed requests before it.
                req_index = self.running.index(request)
            step.running_reqs.append(request)
            step.add(request, num_new_tokens, new_blocks)
            self.spec_decode.schedule_drafts(request, num_new_tokens, step)
            req_index += 1

    def _num_new_tokens_running(self, request: Request, token_budget: int) -> int:
        if (
            request.num_output_placeholders > 0
            # (num_computed_tokens + 1) - (num_output_placeholders - 1)
            # = num_tokens + 1 without drafts: a lower bound of the
            # tokens the request holds once its steps in flight return
            # (each returns at least one token; drafts may be rejected).
            and request.num_computed_tokens + 2 - request.num_output_placeholders
            >= request.num_prompt_tokens + request.max_tokens
        ):
            # Async scheduling: the steps in flight already produce the last
            # allowed token; one more step would be thrown away.
            return 0
        num_new_tokens = (
            request.num_tokens_with_spec
            + request.num_output_placeholders
            - request.num_computed_tokens
        )
        threshold = self.scheduler_config.long_prefill_token_threshold
        if 0 < threshold < num_new_tokens:
            num_new_tokens = threshold
        num_new_tokens = min(num_new_tokens, token_budget)
        # Input positions must stay below max_model_len. Known tokens always
        # do (num_tokens <= max_model_len); tokens beyond them (async
        # placeholders, drafts) stop at position max_model_len - 2, whose
        # sampled token already ends the request. (Upstream caps all tokens
        # at max_model_len - 1, which stalls the last token of a chunked
        # prompt of exactly max_model_len tokens.)
        limit = max(self.max_model_len - 1, request.num_tokens)
        return max(0, min(num_new_tokens, limit - request.num_computed_tokens))

    def _allocate_running(
        self, request: Request, num_new_tokens: int, step: SchedulingStep
    ) -> KVCacheBlocks | None:
        """Allocate slots for a running request, preempting other requests
        until it fits. Returns None when `request` itself was preempted."""
        while True:
            new_blocks = self.kv_cache_manager.allocate_slots(
                request, num_new_tokens, num_lookahead_tokens=self.num_lookahead_tokens
            )
            if new_blocks is not None:
                return new_blocks
            victim = pop_preemption_victim(self.running, self.policy)
            step.unschedule(victim)
            self._preempt_request(victim, step.timestamp)
            step.preempted_reqs.append(victim)
            if victim is request:
                return None

    def _preempt_request(self, request: Request, timestamp: float) -> None:
        """Free a running request's KV blocks and put it back at the head of
        the waiting queue; it will recompute from scratch (its prefix may
        still hit the prefix cache). The caller removed it from `running`."""
        assert request.status == RequestStatus.RUNNING, "only running requests are preempted"
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        if request.spec_token_ids:
            request.spec_token_ids = []
        request.num_preemptions += 1
        if self.log_stats:
            request.record_event(EngineCoreEventType.PREEMPTED, timestamp)
        self.waiting.prepend_request(request)

    def _schedule_waiting(self, step: SchedulingStep) -> None:
        # Requests whose grammar is still compiling step aside for this step
        # and go back to the head of the queue, in order, afterwards.
        skipped_waiting = create_request_queue(self.policy)
        running_loras = running_lora_ids(self.running, self.lora_config)
        while self.waiting and step.token_budget > 0:
            if len(self.running) == self.max_num_running_reqs:
                break
            request = self.waiting.peek_request()
            if (
                request.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
                and not self.structured_output.admit(request, self.waiting, skipped_waiting)
            ):
                continue
            if exceeds_max_loras(request, running_loras, self.lora_config):
                # One more adapter would exceed max_loras: this request steps
                # aside (keeping its place) until a running adapter finishes.
                skipped_waiting.prepend_request(self.waiting.pop_request())
                continue
            new_computed_blocks, num_computed_tokens = self._get_computed_blocks(request)
            num_new_tokens = self._num_new_tokens_waiting(
                request, num_computed_tokens, step.token_budget
            )
            if num_new_tokens == 0:
                # Chunked prefill is off and the prompt does not fit: stop
                # here to keep the queue order.
                break
            new_blocks = self.kv_cache_manager.allocate_slots(
                request,
                num_new_tokens,
                num_new_computed_tokens=num_computed_tokens,
                new_computed_blocks=new_computed_blocks,
                num_lookahead_tokens=self.num_lookahead_tokens,
                has_scheduled_reqs=bool(step.num_scheduled_tokens),
            )
            if new_blocks is None:
                # Out of KV blocks: later requests would not fit either.
                break
            self.waiting.pop_request()
            self._admit_request(request, num_new_tokens, num_computed_tokens, step)
            if request.lora_request is not None:
                running_loras.add(request.lora_request.lora_int_id)
        if skipped_waiting:
            self.waiting.prepend_requests(skipped_waiting)

    def _get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """The request's prefix-cache hit: (blocks, number of tokens)."""
        # The third value, the shared-prefix boundary, only matters to the
        # sparse groups of hybrid models, which are not supported.
        blocks, num_tokens, _ = self.kv_cache_manager.get_computed_blocks(request)
        return blocks, num_tokens

    def _num_new_tokens_waiting(
        self, request: Request, num_computed_tokens: int, token_budget: int
    ) -> int:
        # num_tokens, not num_prompt_tokens: a resumed request recomputes its
        # generated tokens too.
        num_new_tokens = request.num_tokens - num_computed_tokens
        threshold = self.scheduler_config.long_prefill_token_threshold
        if 0 < threshold < num_new_tokens:
            num_new_tokens = threshold
        if not self.scheduler_config.enable_chunked_prefill and num_new_tokens > token_budget:
            return 0
        num_new_tokens = min(num_new_tokens, token_budget)
        # Prefix hits stop one token short of num_tokens, so there is always
        # something left to compute.
        assert num_new_tokens > 0
        return num_new_tokens

    def _admit_request(
        self, request: Request, num_new_tokens: int, num_computed_tokens: int, step: SchedulingStep
    ) -> None:
        """Move a request popped from the waiting queue to running."""
        self.running.append(request)
        if self.log_stats:
            request.record_event(EngineCoreEventType.SCHEDULED, step.timestamp)
        if request.status == RequestStatus.WAITING:
            step.new_reqs.append(request)
        elif request.status == RequestStatus.PREEMPTED:
            step.resumed_reqs.append(request)
        else:
            raise RuntimeError(f"Invalid request status: {request.status}")
        # The workers get every block of an admitted request, the prefix
        # hits included (a resumed request's list replaces its old one).
        step.add(request, num_new_tokens, self.kv_cache_manager.get_blocks(request.request_id))
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = num_computed_tokens
        if request.num_cached_tokens < 0:
            # Only the first admission counts as the prefix-cache hit.
            request.num_cached_tokens = num_computed_tokens

    # ------------------------------------------------------------------
    # Building the SchedulerOutput
    # ------------------------------------------------------------------

    def _make_scheduler_output(self, step: SchedulingStep) -> SchedulerOutput:
        num_common_prefix_blocks = [0] * len(self.kv_cache_config.kv_cache_groups)
        if self.running:
            # Blocks shared by every running request (cascade attention).
            num_common_prefix_blocks = list(
                self.kv_cache_manager.get_num_common_prefix_blocks(self.running[0].request_id)
            )
        new_reqs_data, resumed_reqs = make_new_reqs_data(
            step.new_reqs, step.resumed_reqs, step.req_to_new_blocks, self.use_v2_model_runner
        )
        # Diffs for the requests the workers already hold.
        cached_reqs_data = make_cached_request_data(
            step.running_reqs,
            resumed_reqs,
            step.num_scheduled_tokens,
            step.scheduled_spec_decode_tokens,
            step.req_to_new_blocks,
            self.prev_step_scheduled_req_ids,
            self.use_pp,
            self.use_v2_model_runner,
        )
        # Must follow make_cached_request_data, which reads the old value.
        self.prev_step_scheduled_req_ids = set(step.num_scheduled_tokens)
        return SchedulerOutput(
            scheduled_new_reqs=new_reqs_data,
            scheduled_cached_reqs=cached_reqs_data,
            num_scheduled_tokens=step.num_scheduled_tokens,
            total_num_scheduled_tokens=step.total_num_scheduled_tokens,
            scheduled_spec_decode_tokens=step.scheduled_spec_decode_tokens,
            scheduled_encoder_inputs={},
            num_common_prefix_blocks=num_common_prefix_blocks,
            has_structured_output_requests=any(
                self.requests[req_id].use_structured_output for req_id in step.num_scheduled_tokens
            ),
            preempted_req_ids=(
                {req.request_id for req in step.preempted_reqs}
                | self._take_preempted_outside_schedule()
            ),
            # Not decided in this step: the requests that finished since the
            # previous one (_update_after_schedule starts a new set).
            finished_req_ids=self.finished_req_ids,
            free_encoder_mm_hashes=[],
        )

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        # Advance num_computed_tokens now, before the step runs: the output
        # above already carries the old values the workers need, and a
        # chunked prefill can be scheduled again right away in the next step
        # (async scheduling) without waiting for this one to finish.
        for req_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
            request = self.requests[req_id]
            request.num_computed_tokens += num_tokens
            request.is_prefill_chunk = request.num_computed_tokens < (
                request.num_tokens + request.num_output_placeholders
            )
        # A new set, not clear(): the output holds the old one.
        self.finished_req_ids = set()

    def get_grammar_bitmask(self, scheduler_output: SchedulerOutput) -> GrammarOutput | None:
        """The grammar bitmask of the structured-output requests that sample
        in this step, or None. Call it only after every earlier step's
        update_from_output (the grammars must have seen their tokens)."""
        return self.structured_output.grammar_bitmask(self.requests, scheduler_output)

    # ------------------------------------------------------------------
    # update_from_output()
    # ------------------------------------------------------------------

    def update_from_output(
        self,
        scheduler_output: SchedulerOutput,
        model_runner_output: ModelRunnerOutput,
    ) -> dict[int, EngineCoreOutputs]:
        outputs = self.structured_output.take_error_outputs()
        stopped_running_reqs: set[Request] = set()
        stopped_preempted_reqs: set[Request] = set()
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                # Aborted while the model was running it (async scheduling,
                # pipeline parallelism): its results are dropped.
                continue
            status_before = request.status
            drafts = scheduler_output.scheduled_spec_decode_tokens.get(req_id)
            num_invalid = (scheduler_output.num_invalid_spec_tokens or {}).get(req_id, 0)
            output = self._process_request_output(request, model_runner_output, drafts, num_invalid)
            if request.is_finished():
                if status_before == RequestStatus.RUNNING:
                    stopped_running_reqs.add(request)
                else:
                    stopped_preempted_reqs.add(request)
            if output is not None:
                outputs[request.client_index].append(output)

        if stopped_running_reqs:
            self.running = remove_all(self.running, stopped_running_reqs)
        if stopped_preempted_reqs:
            # Rare: preempted while its last step was still in flight.
            self.waiting.remove_requests(stopped_preempted_reqs)
        stats = self.make_stats(self.spec_decode.take_stats())
        return make_engine_core_outputs(outputs, self.finished_req_ids_dict, stats)

    def _process_request_output(
        self,
        request: Request,
        model_runner_output: ModelRunnerOutput,
        scheduled_drafts: list[int] | None = None,
        num_invalid_drafts: int = 0,
    ) -> EngineCoreOutput | None:
        """Apply one request's results (and verified drafts, of which
        `num_invalid_drafts` were ruled out by its grammar); return its
        output, if any."""
        req_id = request.request_id
        req_index = model_runner_output.req_id_to_index[req_id]
        sampled = model_runner_output.sampled_token_ids
        # Empty while the request is mid-prefill.
        new_token_ids = list(sampled[req_index]) if sampled else []
        pooler_outputs = model_runner_output.pooler_output
        pooler_output = pooler_outputs[req_index] if pooler_outputs else None

        num_rejected = self.spec_decode.num_rejected(
            request, scheduled_drafts, new_token_ids, num_invalid_drafts
        )
        if num_rejected:
            self._rollback_rejected_drafts(request, num_rejected)
        stopped = False
        if new_token_ids:
            new_token_ids, stopped = self._update_request_with_output(request, new_token_ids)
            self.structured_output.advance(request, new_token_ids)
        elif request.pooling_params is not None and pooler_output is not None:
            # A pooling request is done as soon as it has its output.
            request.status = RequestStatus.FINISHED_STOPPED
            stopped = True
        finish_reason = None
        if stopped:
            finish_reason = request.get_finished_reason()
            self._free_request(request)

        new_logprobs = None
        logprobs = model_runner_output.logprobs
        if (
            logprobs is not None
            and new_token_ids
            and request.sampling_params is not None
            and request.sampling_params.logprobs is not None
        ):
            new_logprobs = logprobs.slice_request(req_index, len(new_token_ids))  # row per token
        prompt_logprobs = model_runner_output.prompt_logprobs_dict.get(req_id)
        if not (
            new_token_ids or stopped or pooler_output is not None or prompt_logprobs is not None
        ):
            return None
        return EngineCoreOutput(
            request_id=req_id,
            new_token_ids=new_token_ids,
            finish_reason=finish_reason,
            new_logprobs=new_logprobs,
            new_prompt_logprobs_tensors=prompt_logprobs,
            pooling_output=pooler_output,
            stop_reason=request.stop_reason,
            events=request.take_events(),
            trace_headers=request.trace_headers,
            num_cached_tokens=request.num_cached_tokens,
        )

    def _rollback_rejected_drafts(self, request: Request, num_rejected: int) -> None:
        request.num_computed_tokens -= num_rejected  # the next step overwrites their KV

    def update_draft_token_ids(self, draft_token_ids: DraftTokenIds) -> None:
        """New drafts from the runner, before the next schedule()."""
        self.spec_decode.update_draft_token_ids(self.requests, draft_token_ids)

    def update_draft_token_ids_in_output(
        self, draft_token_ids: DraftTokenIds, scheduler_output: SchedulerOutput
    ) -> None:
        """Async scheduling: the runner's drafts in place of a scheduled step's
        placeholders, cut to their grammar-valid prefix (spec_decode.py)."""
        self.spec_decode.update_draft_token_ids_in_output(
            self.requests, draft_token_ids, scheduler_output
        )

    def _update_request_with_output(
        self, request: Request, new_token_ids: list[int]
    ) -> tuple[list[int], bool]:
        """Append sampled tokens one by one, checking the stop conditions
        after each; tokens after the stopping one are dropped."""
        for num_new, token_id in enumerate(new_token_ids, 1):
            request.append_output_token_ids(token_id)
            if check_stop(request, self.max_model_len):
                return new_token_ids[:num_new], True
        return new_token_ids, False

    # ------------------------------------------------------------------
    # Requests in and out
    # ------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"Request id {request.request_id} is already in use")
        # Requests built past the InputProcessor (e.g. an EngineCoreRequest sent
        # to the core directly) must not run with their images silently
        # dropped, nor name an adapter when LoRA is off.
        if request.mm_features:
            raise ValueError("Multimodal inputs are not supported")
        if request.lora_request is not None and self.lora_config is None:
            raise ValueError(f"Got lora_request {request.lora_request} but LoRA is not enabled!")
        self.waiting.add_request(request)
        self.requests[request.request_id] = request
        if self.log_stats:
            request.record_event(EngineCoreEventType.QUEUED)

    def finish_requests(
        self,
        request_ids: str | Iterable[str] | None,
        finished_status: RequestStatus,
    ) -> list[tuple[str, int]]:
        """See SchedulerInterface.finish_requests."""
        assert RequestStatus.is_finished(finished_status)
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        elif request_ids is None:
            request_ids = list(self.requests)
        else:
            request_ids = set(request_ids)

        running_to_remove: set[Request] = set()
        waiting_to_remove: list[Request] = []
        finished: list[Request] = []
        for req_id in request_ids:
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                continue
            finished.append(request)
            if request.status == RequestStatus.RUNNING:
                running_to_remove.add(request)
            else:
                waiting_to_remove.append(request)
        # Remove from the queues in one pass each.
        if running_to_remove:
            self.running = remove_all(self.running, running_to_remove)
        if waiting_to_remove:
            self.waiting.remove_requests(waiting_to_remove)
        for request in finished:
            request.status = finished_status
            self._free_request(request)
        return [(r.request_id, r.client_index) for r in finished]

    def _free_request(self, request: Request) -> None:
        """Release a finished request: KV blocks, bookkeeping, and the note
        to the workers (finished_req_ids)."""
        assert request.is_finished()
        request_id = request.request_id
        self.finished_req_ids.add(request_id)
        if self.finished_req_ids_dict is not None:
            self.finished_req_ids_dict[request.client_index].add(request_id)
        self.kv_cache_manager.free(request)
        del self.requests[request_id]

    # ------------------------------------------------------------------
    # Queries and maintenance
    # ------------------------------------------------------------------

    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_finished_requests(self) -> bool:
        return len(self.finished_req_ids) > 0

    def get_request_counts(self) -> tuple[int, int]:
        """(number of running requests, number of waiting requests)."""
        return len(self.running), len(self.waiting)

    def _take_preempted_outside_schedule(self) -> set[str]:
        taken, self.preempted_outside_schedule = self.preempted_outside_schedule, set()
        return taken

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        if reset_running_requests:
            # Preempt from the back so that the requests come back in their
            # running order (each is prepended to the waiting queue).
            timestamp = time.monotonic()
            while self.running:
                request = self.running.pop()
                self._preempt_request(request, timestamp)
                self.preempted_outside_schedule.add(request.request_id)
            # The workers will drop these requests; act as if none was
            # scheduled in the previous step.
            self.prev_step_scheduled_req_ids.clear()
        reset_successful = self.kv_cache_manager.reset_prefix_cache()
        if reset_running_requests and not reset_successful:
            raise RuntimeError(
                "Failed to reset the prefix cache even after preempting every running request"
            )
        return reset_successful

    def make_stats(
        self, spec_decoding_stats: SpecDecodingStats | None = None
    ) -> SchedulerStats | None:
        if not self.log_stats:
            return None
        prefix_cache_stats = self.kv_cache_manager.make_prefix_cache_stats()
        assert prefix_cache_stats is not None
        return SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            kv_cache_usage=self.kv_cache_manager.usage,
            prefix_cache_stats=prefix_cache_stats,
            spec_decoding_stats=spec_decoding_stats,
        )

    def shutdown(self) -> None:
        pass  # upstream stops its KV-event publisher and KV connector: none here
