"""From engine-core outputs to `RequestOutput`s (upstream: vllm/v1/engine/output_processor.py).

The front end keeps one `RequestState` per live request: its detokenizer,
its logprobs and how its outputs are to be shaped (CUMULATIVE, DELTA or
FINAL_ONLY). `OutputProcessor.process_outputs` is the one loop over a step's
outputs: detokenize, check stop strings (a stop string found here finishes
the request, which the engine core must then be told to abort), and build
the `RequestOutput`s.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm.outputs import (
    CompletionOutput,
    PoolingOutput,
    PoolingRequestOutput,
    RequestMetrics,
    RequestOutput,
)
from vllm.sampling_params import RequestOutputKind
from vllm.tracing import SpanAttributes, SpanKind, extract_trace_context, instrument_manual
from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
from vllm.v1.engine.detokenizer import IncrementalDetokenizer
from vllm.v1.engine.logprobs import LogprobsProcessor

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest
    from vllm.tokenizers import TokenizerLike
    from vllm.v1.engine.parallel_sampling import ParentRequest
    from vllm.v1.metrics.stats import FinishedRequestStats, RequestStateStats


class RequestOutputCollector:
    """Per-request hand-off from the output loop to an async `generate()`.

    When the consumer falls behind, DELTA outputs are merged into the one
    waiting, other kinds replace it, so the queue never grows.
    """

    def __init__(self, output_kind: RequestOutputKind) -> None:
        self.aggregate = output_kind == RequestOutputKind.DELTA
        # A pooling request's one PoolingRequestOutput travels here too.
        self.output: RequestOutput | Exception | None = None
        self.ready = asyncio.Event()

    def put(self, output: RequestOutput | Exception) -> None:
        if self.output is None or isinstance(output, Exception):
            self.output = output
            self.ready.set()
        elif isinstance(self.output, RequestOutput):
            self.output.add(output, aggregate=self.aggregate)

    async def get(self) -> RequestOutput:
        while (output := self.output) is None:
            await self.ready.wait()
        self.output = None
        self.ready.clear()
        if isinstance(output, Exception):
            raise output
        return output

    def get_nowait(self) -> RequestOutput | None:
        output = self.output
        if output is not None:
            self.output = None
            self.ready.clear()
        if isinstance(output, Exception):
            raise output
        return output


@dataclass
class OutputProcessorOutput:
    request_outputs: list[RequestOutput | PoolingRequestOutput[Any]]
    reqs_to_abort: list[str]


class RequestState:
    """Front-end state of one request."""

    def __init__(
        self,
        request_id: str,
        external_req_id: str,
        parent_req: ParentRequest | None,
        request_index: int,
        lora_request: LoRARequest | None,
        output_kind: RequestOutputKind,
        prompt: str | None,
        prompt_token_ids: list[int] | None,
        logprobs_processor: LogprobsProcessor,
        detokenizer: IncrementalDetokenizer,
        max_tokens_param: int | None,
        arrival_time: float,
        queue: RequestOutputCollector | None,
        log_stats: bool,
        stream_interval: int,
    ) -> None:
        self.request_id = request_id
        self.external_req_id = external_req_id
        self.parent_req = parent_req
        self.request_index = request_index
        self.lora_request = lora_request
        self.output_kind = output_kind
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.prompt_len = len(prompt_token_ids or [])
        self.logprobs_processor = logprobs_processor
        self.detokenizer = detokenizer
        self.max_tokens_param = max_tokens_param
        self.is_prefilling = True
        self.queue = queue
        self.num_cached_tokens = 0
        self.stats = RequestMetrics(arrival_time=arrival_time) if log_stats else None
        self.stream_interval = stream_interval
        self.sent_tokens_offset = 0  # output tokens already sent (stream_interval > 1)
        self.is_pooling = False  # set by _for_pooling

    @classmethod
    def from_new_request(
        cls,
        tokenizer: TokenizerLike | None,
        request: EngineCoreRequest,
        prompt: str | None,
        parent_req: ParentRequest | None,
        request_index: int,
        queue: RequestOutputCollector | None,
        log_stats: bool,
        stream_interval: int,
    ) -> RequestState:
        params = request.sampling_params
        if params is None:
            return cls._for_pooling(request, prompt, queue, log_stats)
        if not params.detokenize:
            tokenizer = None
        return cls(
            request_id=request.request_id,
            external_req_id=request.external_req_id or request.request_id,
            parent_req=parent_req,
            request_index=request_index,
            lora_request=request.lora_request,
            output_kind=params.output_kind,
            prompt=prompt,
            prompt_token_ids=request.prompt_token_ids,
            logprobs_processor=LogprobsProcessor.from_new_request(tokenizer, request),
            detokenizer=IncrementalDetokenizer.from_new_request(tokenizer, request),
            max_tokens_param=params.max_tokens,
            arrival_time=request.arrival_time,
            queue=queue,
            log_stats=log_stats,
            stream_interval=stream_interval,
        )

    @classmethod
    def _for_pooling(
        cls,
        request: EngineCoreRequest,
        prompt: str | None,
        queue: RequestOutputCollector | None,
        log_stats: bool,
    ) -> RequestState:
        """A pooling request: no detokenizer or logprobs; one final output."""
        state = cls(
            request_id=request.request_id,
            external_req_id=request.external_req_id or request.request_id,
            parent_req=None,
            request_index=0,
            lora_request=request.lora_request,
            output_kind=RequestOutputKind.FINAL_ONLY,
            prompt=prompt,
            prompt_token_ids=request.prompt_token_ids,
            logprobs_processor=LogprobsProcessor(
                tokenizer=None,
                logprobs=None,
                prompt_logprobs=None,
                cumulative_logprob=None,
                num_logprobs=None,
                num_prompt_logprobs=None,
            ),
            detokenizer=IncrementalDetokenizer(),
            max_tokens_param=None,
            arrival_time=request.arrival_time,
            queue=queue,
            log_stats=log_stats,
            stream_interval=1,
        )
        state.is_pooling = True
        return state

    def make_pooling_output(self, eco: EngineCoreOutput) -> PoolingRequestOutput[Any] | None:
        """The pooling request's output once the engine sent its tensor."""
        if eco.pooling_output is None:
            return None
        return PoolingRequestOutput(
            request_id=self.external_req_id,
            outputs=PoolingOutput(data=eco.pooling_output),
            prompt_token_ids=list(self.prompt_token_ids or []),
            num_cached_tokens=self.num_cached_tokens,
            finished=True,
        )

    def make_request_output(
        self,
        new_token_ids: list[int],
        finish_reason: FinishReason | None,
        stop_reason: int | str | None,
    ) -> RequestOutput | None:
        """The output to emit now, or None (FINAL_ONLY before the end, or between
        stream intervals)."""
        finished = finish_reason is not None
        if not finished and self.output_kind == RequestOutputKind.FINAL_ONLY:
            return None
        delta = self.output_kind == RequestOutputKind.DELTA
        if self.stream_interval > 1:
            num_out = self.detokenizer.num_output_tokens()
            due = (
                finished
                or self.sent_tokens_offset == 0
                or num_out - self.sent_tokens_offset >= self.stream_interval
            )
            if not due:
                return None
            if delta:
                # Tokens held back by the interval go out with this output.
                new_token_ids = self.detokenizer.output_token_ids[self.sent_tokens_offset :]
            self.sent_tokens_offset = num_out
        completion = self._new_completion_output(new_token_ids, finish_reason, stop_reason)
        external_req_id = self.external_req_id
        outputs = [completion]
        if self.parent_req is not None:
            # One of n children: the parent decides what goes out, under its id.
            outputs, finished = self.parent_req.get_outputs(self.request_id, completion)
            if not outputs:
                return None
            external_req_id = self.parent_req.external_req_id
        return self._new_request_output(external_req_id, outputs, finished)

    def _new_request_output(
        self, external_req_id: str, outputs: list[CompletionOutput], finished: bool
    ) -> RequestOutput:
        if self.output_kind == RequestOutputKind.DELTA:
            prompt_logprobs = self.logprobs_processor.pop_prompt_logprobs()
        else:
            prompt_logprobs = self.logprobs_processor.prompt_logprobs
        return RequestOutput(
            request_id=external_req_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            prompt_logprobs=prompt_logprobs,
            outputs=outputs,
            finished=finished,
            metrics=self.stats,
            lora_request=self.lora_request,
            num_cached_tokens=self.num_cached_tokens,
        )

    def _new_completion_output(
        self,
        token_ids: list[int],
        finish_reason: FinishReason | None,
        stop_reason: int | str | None,
    ) -> CompletionOutput:
        finished = finish_reason is not None
        delta = self.output_kind == RequestOutputKind.DELTA
        text = self.detokenizer.get_next_output_text(finished, delta)
        if not delta:
            token_ids = list(self.detokenizer.output_token_ids)
        logprobs = self.logprobs_processor.logprobs
        if delta and logprobs is not None:
            logprobs = logprobs[len(logprobs) - len(token_ids) :] if token_ids else []
        return CompletionOutput(
            index=self.request_index,
            text=text,
            token_ids=list(token_ids),
            cumulative_logprob=self.logprobs_processor.cumulative_logprob,
            logprobs=logprobs,
            finish_reason=str(finish_reason) if finished else None,
            stop_reason=stop_reason if finished else None,
        )


class OutputProcessor:
    """Turns `EngineCoreOutput`s into `RequestOutput`s (front-end side)."""

    def __init__(
        self, tokenizer: TokenizerLike | None, log_stats: bool, stream_interval: int = 1
    ) -> None:
        self.tokenizer = tokenizer
        self.log_stats = log_stats
        self.stream_interval = stream_interval
        self.request_states: dict[str, RequestState] = {}
        # internal id of an n > 1 request -> its ParentRequest (its children
        # are in request_states under their own ids)
        self.parent_requests: dict[str, Any] = {}
        # external (user) id -> internal ids; one user id may name several requests
        self.external_req_ids: defaultdict[str, list[str]] = defaultdict(list)

    def get_num_unfinished_requests(self) -> int:
        return len(self.request_states)

    def has_unfinished_requests(self) -> bool:
        return len(self.request_states) > 0

    def propagate_error(self, e: Exception) -> None:
        """Hand an engine failure to every waiting async `generate()`."""
        for state in self.request_states.values():
            if state.queue is not None:
                state.queue.put(e)

    def add_request(
        self,
        request: EngineCoreRequest,
        prompt: str | None,
        parent_req: ParentRequest | None = None,
        request_index: int = 0,
        queue: RequestOutputCollector | None = None,
    ) -> None:
        request_id = request.request_id
        if request_id in self.request_states:
            raise ValueError(f"Request id {request_id} already running.")
        state = RequestState.from_new_request(
            self.tokenizer,
            request,
            prompt,
            parent_req,
            request_index,
            queue,
            self.log_stats,
            self.stream_interval,
        )
        self.request_states[request_id] = state
        self.external_req_ids[state.external_req_id].append(request_id)
        if parent_req is not None:
            self.parent_requests[parent_req.request_id] = parent_req

    def abort_requests(self, request_ids: Iterable[str], internal: bool = False) -> list[str]:
        """Forget the given requests; return the internal ids the core must abort.

        Ids are internal ones, or (internal=False) also external ones, which
        abort every request that was submitted under that id.
        """
        internal_ids: list[str] = []
        for rid in request_ids:
            if rid in self.request_states:
                internal_ids.append(rid)
            elif rid in self.parent_requests:
                # An n > 1 request: abort its unfinished children.
                internal_ids.extend(sorted(self.parent_requests[rid].child_requests))
            elif not internal:
                internal_ids.extend(self.external_req_ids.get(rid, []))
        aborted = []
        for rid in internal_ids:
            state = self.request_states.get(rid)
            if state is None:
                continue
            self._finish_request(state)
            aborted.append(rid)
            if state.queue is not None:
                # An async consumer is waiting: give it a final "abort" output.
                output = state.make_request_output([], FinishReason.ABORT, None)
                if output is not None:
                    state.queue.put(output)
        return aborted

    def process_outputs(
        self,
        engine_core_outputs: list[EngineCoreOutput],
        engine_core_timestamp: float | None = None,
        iteration_stats: Any | None = None,
    ) -> OutputProcessorOutput:
        """Detokenize, apply stop strings and build this step's `RequestOutput`s.

        Outputs of requests that were already aborted are ignored. Outputs go
        to each request's queue when it has one (async), else are returned.
        """
        request_outputs: list[RequestOutput | PoolingRequestOutput[Any]] = []
        reqs_to_abort: list[str] = []
        for eco in engine_core_outputs:
            state = self.request_states.get(eco.request_id)
            if state is None:
                continue
            self._update_stats(state, eco, engine_core_timestamp)
            if state.is_pooling:
                self._process_pooling_output(state, eco, request_outputs)
                continue
            finish_reason, stop_reason = eco.finish_reason, eco.stop_reason
            num_prev = state.detokenizer.num_output_tokens()
            stop_string = state.detokenizer.update(
                eco.new_token_ids, finish_reason == FinishReason.STOP
            )
            new_token_ids = eco.new_token_ids
            if stop_string:
                finish_reason, stop_reason = FinishReason.STOP, stop_string
                # Drop tokens past the one that completed the stop string.
                num_kept = state.detokenizer.num_output_tokens() - num_prev
                new_token_ids = new_token_ids[:num_kept]
                if eco.new_logprobs is not None:
                    eco.new_logprobs = eco.new_logprobs.slice(0, num_kept)
            state.logprobs_processor.update_from_output(eco)
            output = state.make_request_output(new_token_ids, finish_reason, stop_reason)
            if output is not None:
                if state.queue is not None:
                    state.queue.put(output)
                else:
                    request_outputs.append(output)
            if finish_reason is not None:
                self._finish_request(state)
                if state.stats is not None:
                    state.stats.finished_time = time.time()
                if not eco.finished:
                    # Finished here (stop string) while the core still runs it.
                    reqs_to_abort.append(eco.request_id)
        return OutputProcessorOutput(request_outputs=request_outputs, reqs_to_abort=reqs_to_abort)

    def _process_pooling_output(
        self, state: RequestState, eco: EngineCoreOutput, request_outputs: list[Any]
    ) -> None:
        output = state.make_pooling_output(eco)
        if output is not None:
            if state.queue is not None:
                state.queue.put(output)  # type: ignore[arg-type]
            else:
                request_outputs.append(output)
        if eco.finish_reason is not None:
            self._finish_request(state)
            if state.stats is not None:
                state.stats.finished_time = time.time()

    def _update_stats(
        self, state: RequestState, eco: EngineCoreOutput, engine_core_timestamp: float | None
    ) -> None:
        if state.is_prefilling:
            state.num_cached_tokens = eco.num_cached_tokens
            state.is_prefilling = False
        if state.stats is None or not eco.new_token_ids:
            return
        now = time.time()
        if state.stats.first_token_time is None:
            state.stats.first_token_time = now
        state.stats.last_token_time = now

    def _finish_request(self, state: RequestState) -> None:
        self.request_states.pop(state.request_id, None)
        parent = state.parent_req
        if parent is not None and not any(
            cid in self.request_states for cid in parent.child_requests
        ):
            self.parent_requests.pop(parent.request_id, None)
        ids = self.external_req_ids.get(state.external_req_id)
        if ids is not None:
            if state.request_id in ids:
                ids.remove(state.request_id)
            if not ids:
                del self.external_req_ids[state.external_req_id]


def do_tracing(
    request: EngineCoreRequest, finished: FinishedRequestStats, req_stats: RequestStateStats
) -> None:
    """Export the "llm_request" span of a finished request (--otlp-traces-endpoint).

    Upstream: `OutputProcessor.do_tracing`; here the timings come from the
    front end's stats tracker (`vllm/v1/engine/async_llm.py`), which computed
    `finished` for the metrics. The span starts at the request's arrival, ends
    now, and is a child of the caller's span when the request carried W3C
    trace headers.
    """
    attributes: dict[str, Any] = {
        SpanAttributes.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN: req_stats.first_token_latency,
        SpanAttributes.GEN_AI_LATENCY_E2E: finished.e2e_latency,
        SpanAttributes.GEN_AI_LATENCY_TIME_IN_QUEUE: finished.queued_time,
        SpanAttributes.GEN_AI_USAGE_PROMPT_TOKENS: finished.num_prompt_tokens,
        SpanAttributes.GEN_AI_USAGE_COMPLETION_TOKENS: finished.num_generation_tokens,
        SpanAttributes.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL: finished.prefill_time,
        SpanAttributes.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE: finished.decode_time,
        SpanAttributes.GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE: finished.inference_time,
        SpanAttributes.GEN_AI_REQUEST_ID: request.external_req_id or request.request_id,
    }
    params = request.sampling_params
    if params is not None:
        # As upstream: only the values that are set (and non-zero).
        for name, value in (
            (SpanAttributes.GEN_AI_REQUEST_TOP_P, params.top_p),
            (SpanAttributes.GEN_AI_REQUEST_MAX_TOKENS, params.max_tokens),
            (SpanAttributes.GEN_AI_REQUEST_TEMPERATURE, params.temperature),
            (SpanAttributes.GEN_AI_REQUEST_N, params.n),
        ):
            if value:
                attributes[name] = value
    instrument_manual(
        span_name="llm_request",
        start_time=int(req_stats.arrival_time * 1e9),
        attributes=attributes,
        context=extract_trace_context(request.trace_headers),
        kind=SpanKind.SERVER,
    )
