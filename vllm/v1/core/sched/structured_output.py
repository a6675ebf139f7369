"""The scheduler's structured-output part: `StructuredOutputScheduling`, owned
by the `Scheduler`, follows each request with a grammar from admission to its
last token (upstream keeps these steps inline in
vllm/v1/core/sched/scheduler.py).

    add_request        request waits in WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
    schedule()         `admit`: compiled -> WAITING, schedulable;
                       compiling -> skipped this step (others are not blocked);
                       failed -> FINISHED_ERROR, finish_reason "error"
    engine core        `Scheduler.get_grammar_bitmask(scheduler_output)`
                       (`grammar_bitmask` here) -> sample_tokens
    update_from_output `advance` with the accepted tokens
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

from vllm.logger import init_logger
from vllm.v1.core.sched.output import GrammarOutput
from vllm.v1.core.sched.utils import structured_output_req_ids_to_sample
from vllm.v1.engine import EngineCoreOutput
from vllm.v1.request import RequestStatus

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.request_queue import RequestQueue
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

logger = init_logger(__name__)


class StructuredOutputScheduling:
    """Owned by the Scheduler: grammar readiness at admission, the step's
    bitmask, grammar advance, and the outputs of requests whose grammar
    failed to compile."""

    def __init__(
        self, manager: StructuredOutputManager, free_request: Callable[[Request], object]
    ) -> None:
        self.manager = manager
        self._free_request = free_request
        # Outputs of requests finished inside schedule() (a grammar that
        # failed to compile), sent with the next update_from_output().
        self._error_outputs: dict[int, list[EngineCoreOutput]] = defaultdict(list)

    def take_error_outputs(self) -> dict[int, list[EngineCoreOutput]]:
        """The error outputs gathered since the last call (client -> list)."""
        outputs, self._error_outputs = self._error_outputs, defaultdict(list)
        return outputs

    def admit(self, request: Request, waiting: RequestQueue, skipped_waiting: RequestQueue) -> bool:
        """For the request at the head of the waiting queue: True once its
        grammar compiled (it becomes WAITING). Otherwise it leaves the queue:
        into `skipped_waiting` while compiling, finished with FINISHED_ERROR
        if compilation failed (the engine carries on)."""
        so_request = request.structured_output_request
        assert so_request is not None
        # Read once: compilation finishes on another thread, and a second read
        # could see it done after the first saw it running.
        ready = so_request.is_grammar_ready
        if ready and so_request.compile_error is None:
            request.status = RequestStatus.WAITING
            return True
        waiting.pop_request()
        if not ready:
            skipped_waiting.prepend_request(request)
            return False
        logger.error(
            "Request %s failed: its structured output grammar did not compile: %s",
            request.request_id,
            so_request.compile_error,
        )
        request.status = RequestStatus.FINISHED_ERROR
        self._free_request(request)
        self._error_outputs[request.client_index].append(
            EngineCoreOutput(
                request_id=request.request_id,
                new_token_ids=[],
                finish_reason=request.get_finished_reason(),
                events=request.take_events(),
                trace_headers=request.trace_headers,
            )
        )
        return False

    def advance(self, request: Request, new_token_ids: list[int]) -> None:
        """Feed the request's accepted tokens to its grammar (when it has one
        that advances)."""
        if not new_token_ids or not self.manager.should_advance(request, new_token_ids):
            return
        so_request = request.structured_output_request
        assert so_request is not None and so_request.grammar is not None
        if not so_request.grammar.accept_tokens(request.request_id, new_token_ids):
            # The bitmask forbids such tokens: a bug, not bad input.
            logger.error(
                "Request %s: the grammar rejected tokens %s", request.request_id, new_token_ids
            )

    def grammar_bitmask(
        self, requests: dict[str, Request], scheduler_output: SchedulerOutput
    ) -> GrammarOutput | None:
        """The bitmask of the structured-output requests that sample in this
        step (row i: request `structured_output_request_ids[i]`), or None.

        Needs the grammars advanced by every earlier step's tokens: call it
        after the earlier steps' update_from_output (see EngineCore)."""
        if not scheduler_output.has_structured_output_requests:
            return None
        req_ids = structured_output_req_ids_to_sample(requests, scheduler_output)
        bitmask = self.manager.grammar_bitmask(
            requests, req_ids, scheduler_output.scheduled_spec_decode_tokens
        )
        if bitmask is None:
            return None
        return GrammarOutput(structured_output_request_ids=req_ids, grammar_bitmask=bitmask)
