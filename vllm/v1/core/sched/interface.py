"""The contract between the engine core and a scheduler."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.metrics.stats import SchedulerStats
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
    from vllm.v1.request import Request, RequestStatus
    from vllm.v1.spec_decode.metrics import SpecDecodingStats


class SchedulerInterface(ABC):
    """What the engine core calls on its scheduler, once per step:
    `schedule()`, then the executor runs the returned batch, then
    `update_from_output()` with what the model runner produced. Requests come
    in through `add_request()` and leave through `update_from_output()` (they
    stopped) or `finish_requests()` (aborted by the client or the frontend).
    """

    @abstractmethod
    def schedule(self) -> SchedulerOutput:
        """Pick the work of the next forward pass.

        Decides, at iteration level, how many tokens of each request to
        compute in this step: a whole or partial prompt for a new request
        (chunked prefill, prefix-cache hits), one token for a decoding request,
        a resumed request's prompt plus generated tokens after preemption. The
        returned `SchedulerOutput` carries those counts plus what the workers
        need to update their cached per-request state (new requests in full,
        running ones as diffs, finished and preempted ids).
        """

    @abstractmethod
    def get_grammar_bitmask(self, scheduler_output: SchedulerOutput) -> GrammarOutput | None:
        """The grammar bitmask for the structured-output requests that sample
        in `scheduler_output`'s step (None when there are none); the engine
        core passes it to the executor's `sample_tokens`."""

    @abstractmethod
    def update_from_output(
        self,
        scheduler_output: SchedulerOutput,
        model_runner_output: ModelRunnerOutput,
    ) -> dict[int, EngineCoreOutputs]:
        """Apply the model runner's results of `scheduler_output`.

        Appends the sampled tokens to their requests, checks the stop
        conditions, frees the requests that finished, and returns the new
        outputs grouped by the client (frontend) index they came from.
        """

    @abstractmethod
    def add_request(self, request: Request) -> None:
        """Queue a new request for scheduling."""

    @abstractmethod
    def finish_requests(
        self,
        request_ids: str | Iterable[str] | None,
        finished_status: RequestStatus,
    ) -> list[tuple[str, int]]:
        """Finish requests from outside the scheduler (None: all of them).

        Called when a client aborts (disconnect, cancel) and when the
        frontend finds a stop string after detokenizing. Unknown or already
        finished ids are ignored. The requests leave the queues, their KV
        blocks are freed and their ids are reported to the workers in the
        next `SchedulerOutput.finished_req_ids`.

        Returns (request_id, client_index) of each request finished here.
        """

    @abstractmethod
    def get_num_unfinished_requests(self) -> int:
        """Number of requests waiting or running."""

    def has_unfinished_requests(self) -> bool:
        """True while some request is waiting or running."""
        return self.get_num_unfinished_requests() > 0

    @abstractmethod
    def has_finished_requests(self) -> bool:
        """True when requests finished since the last `schedule()`, whose ids
        the next `SchedulerOutput` still has to carry to the workers.

        This differs from `not has_unfinished_requests()`: the engine must
        keep stepping until the workers learnt about every finished request.
        """

    def has_requests(self) -> bool:
        """True while there is work or finished-request bookkeeping left."""
        return self.has_unfinished_requests() or self.has_finished_requests()

    @abstractmethod
    def get_request_counts(self) -> tuple[int, int]:
        """(number of running requests, number of waiting requests)."""

    @abstractmethod
    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Drop every cached prefix block (e.g. after a weight update).

        Without `reset_running_requests` this only succeeds when no running
        request holds KV blocks; with it, every running request is preempted
        first. Returns whether the cache was reset.
        """

    @abstractmethod
    def update_draft_token_ids(self, draft_token_ids: DraftTokenIds) -> None:
        """Give the requests the draft tokens the runner proposed in the last
        step (speculative decoding, sync scheduling), each structured-output
        request's drafts cut to the prefix its grammar accepts."""

    @abstractmethod
    def update_draft_token_ids_in_output(
        self, draft_token_ids: DraftTokenIds, scheduler_output: SchedulerOutput
    ) -> None:
        """Async scheduling: put the runner's drafts in place of the
        placeholders `scheduler_output` scheduled (a structured-output
        request's past its grammar-valid prefix as -1), before its grammar
        bitmask is built."""

    @abstractmethod
    def make_stats(
        self, spec_decoding_stats: SpecDecodingStats | None = None
    ) -> SchedulerStats | None:
        """Snapshot of the scheduler for the stats loggers (with the drafts
        verified in the step, if any), or None when stats logging is off."""

    @abstractmethod
    def shutdown(self) -> None:
        """Release what the scheduler holds outside its own memory."""
