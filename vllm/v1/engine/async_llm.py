"""The asyncio engine behind `vllm serve` (upstream: vllm/v1/engine/async_llm.py).

    generate() -> add_request(): InputProcessor (validate, tokenize)
               -> OutputProcessor.add_request(queue=RequestOutputCollector)
               -> AsyncMPClient.add_request_async (ZMQ to the engine-core process)
               ... then yields from the request's collector.

    output_handler (one background task): engine-core outputs -> process them
               in chunks of VLLM_V1_OUTPUT_PROC_CHUNK_SIZE (yielding to the event
               loop between chunks) -> each request's collector; stop strings
               found here abort the request in the core; stats -> loggers.

Failures: a bad request raises from `generate` (ValueError) and leaves the
engine running; if the engine-core process dies, every pending and later
`generate` raises `EngineDeadError` and `errored` becomes True.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Iterable, Mapping
from copy import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import vllm.envs as envs
from vllm.config import VllmConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.engine.protocol import EngineClient
from vllm.exceptions import VLLMClientError, VLLMValidationError
from vllm.inputs import PromptType
from vllm.logger import init_logger
from vllm.outputs import PoolingRequestOutput, RequestOutput
from vllm.pooling_params import PoolingParams
from vllm.sampling_params import SamplingParams
from vllm.tracing import init_tracer
from vllm.transformers_utils.tokenizer import cached_tokenizer_from_config
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
from vllm.v1.engine.core_client_base import EngineCoreClient
from vllm.v1.engine.core_sleep import validate_sleep_args, validate_wake_up_tags
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError, QueueOverflowError
from vllm.v1.engine.input_processor import InputProcessor
from vllm.v1.engine.output_processor import OutputProcessor, RequestOutputCollector, do_tracing
from vllm.v1.engine.parallel_sampling import ParentRequest
from vllm.v1.metrics.loggers import StatLoggerBase, StatLoggerManager
from vllm.v1.metrics.stats import IterationStats, RequestStateStats

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest
    from vllm.tokenizers import TokenizerLike
    from vllm.v1.engine.core_client_mp import AsyncMPClient
    from vllm.v1.executor.abstract import Executor

logger = init_logger(__name__)


@dataclass
class _TrackedRequest:
    stats: RequestStateStats
    prompt_len: int
    max_tokens: int | None
    is_prefilling: bool = True
    # Kept only when tracing: the span needs its trace headers and params.
    request: EngineCoreRequest | None = None


def _max_tokens(request: EngineCoreRequest) -> int | None:
    params = request.sampling_params
    return params.max_tokens if params is not None else None  # None: a pooling request


class _StatsTracker:
    """Front-end per-request timing, turned into `IterationStats` per batch."""

    def __init__(self, logger_manager: StatLoggerManager | None, tracing: bool = False) -> None:
        self.logger_manager = logger_manager
        # --otlp-traces-endpoint: one span per finished request (do_tracing).
        self.tracing = tracing
        self.requests: dict[str, _TrackedRequest] = {}

    def add(self, request: EngineCoreRequest) -> None:
        self.requests[request.request_id] = _TrackedRequest(
            RequestStateStats(arrival_time=time.time()),
            prompt_len=len(request.prompt_token_ids or ()),
            max_tokens=_max_tokens(request),
            request=request if self.tracing else None,
        )

    def forget(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            self.requests.pop(rid, None)

    def observe(
        self, outputs: list[EngineCoreOutput], timestamp: float, iteration_stats: IterationStats
    ) -> None:
        """Count a chunk of outputs (before the output processor consumes them)."""
        for output in outputs:
            tracked = self.requests.get(output.request_id)
            if tracked is None:
                continue
            if output.new_token_ids:
                iteration_stats.update_from_output(
                    output, timestamp, tracked.is_prefilling, tracked.prompt_len, tracked.stats
                )
                tracked.is_prefilling = False
            elif output.events is not None:
                iteration_stats.update_from_events(output.events, tracked.stats)
            if output.finish_reason is not None:
                self.finish(
                    output.request_id,
                    output.finish_reason,
                    iteration_stats,
                    output.num_cached_tokens,
                )

    def finish(
        self,
        request_id: str,
        reason: FinishReason,
        iteration_stats: IterationStats,
        num_cached_tokens: int = 0,
    ) -> None:
        tracked = self.requests.pop(request_id, None)
        if tracked is not None:
            iteration_stats.update_from_finished_request(
                reason, tracked.prompt_len, tracked.max_tokens, tracked.stats, num_cached_tokens
            )
            if tracked.request is not None:
                do_tracing(tracked.request, iteration_stats.finished_requests[-1], tracked.stats)


class AsyncLLM(EngineClient):
    """An asyncio LLM engine whose core runs in a separate process."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        executor_class: type[Executor],
        log_stats: bool,
        usage_context: UsageContext = UsageContext.ENGINE_CONTEXT,
        log_requests: bool = True,
        start_engine_loop: bool = True,
        stat_loggers: list[type[StatLoggerBase]] | None = None,
        max_num_queued_reqs: int | None = None,
        client_addresses: dict[str, Any] | None = None,
        client_count: int = 1,
        client_index: int = 0,
    ) -> None:
        self.vllm_config = vllm_config
        model_config = vllm_config.model_config
        assert model_config is not None, "an engine needs a model"
        self.model_config = model_config
        self.log_requests = log_requests
        self.log_stats = log_stats or bool(stat_loggers)
        self.observability_config = vllm_config.observability_config
        tracing = self.observability_config.tracing_enabled
        if tracing:
            assert self.observability_config.otlp_traces_endpoint is not None
            init_tracer("vllm.llm_engine", self.observability_config.otlp_traces_endpoint)
        # At most this many unfinished requests (n > 1 counts n); None: no limit.
        self.max_num_queued_reqs = max_num_queued_reqs
        self.tokenizer = (
            None
            if self.model_config.skip_tokenizer_init
            else cached_tokenizer_from_config(self.model_config)
        )
        self.input_processor = InputProcessor(vllm_config, self.tokenizer)
        self.output_processor = OutputProcessor(
            self.tokenizer,
            log_stats=self.log_stats,
            stream_interval=vllm_config.scheduler_config.stream_interval,
        )
        self._supported_tasks: tuple[str, ...] | None = None
        # Adapter ids loaded through this engine (see _ensure_lora_loaded).
        self._lora_ids_loaded: set[int] = set()
        # DP > 1: a client that balances over the engine cores. With
        # `client_addresses` (--api-server-count) the parent started them.
        self.engine_core = EngineCoreClient.make_async_mp_client(
            vllm_config=vllm_config,
            executor_class=executor_class,
            # The spans need the core's queued / scheduled timestamps.
            log_stats=self.log_stats or tracing,
            client_addresses=client_addresses,
            client_count=client_count,
            client_index=client_index,
        )
        self.logger_manager: StatLoggerManager | None = None
        self._stats: _StatsTracker | None = None
        if self.log_stats:
            # One series per engine (label engine="<DP rank>"), as upstream.
            self.logger_manager = StatLoggerManager(
                vllm_config,
                engine_idxs=self.engine_core.engine_ranks_managed,
                custom_stat_loggers=stat_loggers,
            )
            self.logger_manager.log_engine_initialized()
        if self.log_stats or tracing:
            self._stats = _StatsTracker(self.logger_manager, tracing)
        self.output_handler: asyncio.Task[None] | None = None
        if start_engine_loop:
            try:
                asyncio.get_running_loop()
                self._run_output_handler()
            except RuntimeError:
                pass  # started by the first generate()

    @classmethod
    def from_vllm_config(
        cls,
        vllm_config: VllmConfig,
        start_engine_loop: bool = True,
        usage_context: UsageContext = UsageContext.ENGINE_CONTEXT,
        stat_loggers: list[type[StatLoggerBase]] | None = None,
        enable_log_requests: bool = False,
        disable_log_stats: bool = False,
        max_num_queued_reqs: int | None = None,
        client_addresses: dict[str, Any] | None = None,
        client_count: int = 1,
        client_index: int = 0,
    ) -> AsyncLLM:
        from vllm.v1.executor.abstract import Executor

        return cls(
            vllm_config=vllm_config,
            executor_class=Executor.get_class(vllm_config),
            log_stats=not disable_log_stats,
            usage_context=usage_context,
            log_requests=enable_log_requests,
            start_engine_loop=start_engine_loop,
            stat_loggers=stat_loggers,
            max_num_queued_reqs=max_num_queued_reqs,
            client_addresses=client_addresses,
            client_count=client_count,
            client_index=client_index,
        )

    @classmethod
    def from_engine_args(
        cls,
        engine_args: AsyncEngineArgs,
        start_engine_loop: bool = True,
        usage_context: UsageContext = UsageContext.ENGINE_CONTEXT,
        stat_loggers: list[type[StatLoggerBase]] | None = None,
    ) -> AsyncLLM:
        """Build the config from `engine_args`, then the engine."""
        vllm_config = engine_args.create_engine_config(usage_context)
        return cls.from_vllm_config(
            vllm_config,
            start_engine_loop=start_engine_loop,
            usage_context=usage_context,
            stat_loggers=stat_loggers,
            enable_log_requests=getattr(engine_args, "enable_log_requests", False),
            disable_log_stats=engine_args.disable_log_stats,
        )

    def __del__(self) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        """Shut down the engine process and the output handler (idempotent)."""
        if (engine_core := getattr(self, "engine_core", None)) is not None:
            engine_core.shutdown()
        handler = getattr(self, "output_handler", None)
        if handler is not None and not handler.done():
            loop = handler.get_loop()
            if not loop.is_closed():
                loop.call_soon_threadsafe(handler.cancel)

    # ------------------------------------------------------------------
    # Requests
    # ------------------------------------------------------------------

    async def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams,
        arrival_time: float | None = None,
        lora_request: LoRARequest | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        trace_headers: Mapping[str, str] | None = None,
        priority: int = 0,
        data_parallel_rank: int | None = None,
        prompt_text: str | None = None,
        reasoning_ended: bool | None = None,
        reasoning_parser_kwargs: dict[str, Any] | None = None,
    ) -> RequestOutputCollector:
        """Add a new request; its outputs arrive in the returned collector."""
        _, queue = await self._add_request_internal(
            request_id,
            prompt,
            params,
            arrival_time,
            lora_request,
            tokenization_kwargs,
            trace_headers,
            priority,
            data_parallel_rank,
            prompt_text,
            reasoning_ended=reasoning_ended,
            reasoning_parser_kwargs=reasoning_parser_kwargs,
        )
        return queue

    async def _add_request_internal(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams | PoolingParams,
        arrival_time: float | None,
        lora_request: LoRARequest | None,
        tokenization_kwargs: dict[str, Any] | None,
        trace_headers: Mapping[str, str] | None,
        priority: int,
        data_parallel_rank: int | None,
        prompt_text: str | None,
        reasoning_ended: bool | None = None,
        reasoning_parser_kwargs: dict[str, Any] | None = None,
    ) -> tuple[str, RequestOutputCollector]:
        """Returns (internal id to abort with, collector)."""
        if self.errored:
            raise EngineDeadError()
        if lora_request is not None and self.vllm_config.lora_config is not None:
            # Before admission: nothing may await between it and the fan-out.
            await self._ensure_lora_loaded(lora_request)
        self._check_admission(getattr(params, "n", 1))
        request = self.input_processor.process_inputs(
            request_id,
            prompt,
            params,
            arrival_time=arrival_time,
            lora_request=lora_request,
            tokenization_kwargs=tokenization_kwargs,
            trace_headers=trace_headers,
            priority=priority,
            data_parallel_rank=data_parallel_rank,
            reasoning_ended=reasoning_ended,
            reasoning_parser_kwargs=reasoning_parser_kwargs,
        )
        self.input_processor.assign_request_id(request)
        if prompt_text is None:
            prompt_text = prompt if isinstance(prompt, str) else prompt.get("prompt")
        queue = RequestOutputCollector(params.output_kind)
        # Register every child with the output processor before the first
        # await: admission and fan-out are atomic on the event loop.
        requests, internal_id = self._fan_out(request, prompt_text, queue)
        try:
            for req in requests:
                await self.engine_core.add_request_async(req)
        except (OverflowError, TypeError) as e:
            # A value msgpack cannot carry (e.g. an int beyond 64 bits): the
            # request's fault, not the engine's.
            await self.abort(internal_id, internal=True)
            raise VLLMValidationError(f"The request could not be sent to the engine: {e}") from e
        if self.log_requests:
            logger.info("Added request %s.", request_id)
        return internal_id, queue

    def _fan_out(
        self, request: EngineCoreRequest, prompt_text: str | None, queue: RequestOutputCollector
    ) -> tuple[list[EngineCoreRequest], str]:
        params = request.sampling_params
        if params is None or params.n == 1:
            self._register(request, prompt_text, None, 0, queue)
            return [request], request.request_id
        parent = ParentRequest(request)
        children = []
        for idx in range(params.n):
            child_id, child_params = parent.get_child_info(idx)
            child = request if idx == params.n - 1 else copy(request)
            child.request_id = child_id
            child.sampling_params = child_params
            self._register(child, prompt_text, parent, idx, queue)
            children.append(child)
        return children, parent.request_id

    def _register(
        self,
        request: EngineCoreRequest,
        prompt_text: str | None,
        parent: ParentRequest | None,
        index: int,
        queue: RequestOutputCollector,
    ) -> None:
        self.output_processor.add_request(request, prompt_text, parent, index, queue)
        if self._stats is not None:
            self._stats.add(request)

    def _check_admission(self, n: int) -> None:
        limit = self.max_num_queued_reqs
        if limit is None:
            return
        unfinished = self.output_processor.get_num_unfinished_requests()
        if unfinished + n > limit:
            raise QueueOverflowError(
                f"The server is busy: {unfinished} requests are in flight (limit {limit}). "
                "Please try again later."
            )

    async def generate(
        self,
        prompt: PromptType,
        sampling_params: SamplingParams,
        request_id: str,
        *,
        prompt_text: str | None = None,
        lora_request: LoRARequest | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        trace_headers: Mapping[str, str] | None = None,
        priority: int = 0,
        data_parallel_rank: int | None = None,
        reasoning_ended: bool | None = None,
        reasoning_parser_kwargs: dict[str, Any] | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Submit one request and yield its outputs as they come.

        Yields `RequestOutput`s until the last one (`finished=True`). Closing
        or cancelling the generator aborts the request in the engine.
        """
        internal_id: str | None = None
        try:
            self._run_output_handler()
            internal_id, q = await self._add_request_internal(
                request_id,
                prompt,
                sampling_params,
                None,
                lora_request,
                tokenization_kwargs,
                trace_headers,
                priority,
                data_parallel_rank,
                prompt_text,
                reasoning_ended=reasoning_ended,
                reasoning_parser_kwargs=reasoning_parser_kwargs,
            )
            finished = False
            while not finished:
                # Take what is ready without a context switch, else wait.
                out = q.get_nowait() or await q.get()
                finished = out.finished
                yield out
        except (asyncio.CancelledError, GeneratorExit):
            # The client went away (or the caller stopped iterating).
            if internal_id is not None:
                await self.abort(internal_id, internal=True)
                if self.log_requests:
                    logger.info("Request %s aborted.", request_id)
            raise
        except EngineDeadError:
            if self.log_requests:
                logger.info("Request %s failed (engine dead).", request_id)
            raise
        except (ValueError, VLLMClientError, QueueOverflowError):
            # Bad input (a missing LoRA adapter too) or back-pressure: this request only.
            raise
        except Exception as e:
            if internal_id is not None:
                await self.abort(internal_id, internal=True)
            logger.info("Request %s failed.", request_id)
            raise EngineGenerateError() from e

    async def encode(
        self,
        prompt: PromptType,
        pooling_params: PoolingParams,
        request_id: str,
        lora_request: LoRARequest | None = None,
        trace_headers: Mapping[str, str] | None = None,
        priority: int = 0,
        tokenization_kwargs: dict[str, Any] | None = None,
    ) -> AsyncGenerator[PoolingRequestOutput[Any], None]:
        """Submit one pooling request (`pooling_params` verified for its task)
        and yield its single, final output. Closing or cancelling the
        generator aborts the request."""
        internal_id: str | None = None
        try:
            self._run_output_handler()
            internal_id, q = await self._add_request_internal(
                request_id,
                prompt,
                pooling_params,
                None,
                lora_request,
                tokenization_kwargs,
                trace_headers,
                priority,
                None,
                None,
            )
            out: Any = q.get_nowait() or await q.get()
            yield cast(PoolingRequestOutput[Any], out)
        except (asyncio.CancelledError, GeneratorExit):
            if internal_id is not None:
                await self.abort(internal_id, internal=True)
            raise
        except (EngineDeadError, ValueError, VLLMClientError, QueueOverflowError):
            raise
        except Exception as e:
            if internal_id is not None:
                await self.abort(internal_id, internal=True)
            logger.info("Request %s failed.", request_id)
            raise EngineGenerateError() from e

    async def abort(self, request_id: str | Iterable[str], internal: bool = False) -> None:
        """Abort requests (by user id, or internal id) in the front end and the core."""
        request_ids = [request_id] if isinstance(request_id, str) else list(request_id)
        all_request_ids = self.output_processor.abort_requests(request_ids, internal)
        if self._stats is not None:
            self._stats.forget(all_request_ids)
        if all_request_ids and not self.errored:
            await self.engine_core.abort_requests_async(all_request_ids)

    # ------------------------------------------------------------------
    # The output handler
    # ------------------------------------------------------------------

    def _run_output_handler(self) -> None:
        """Start the task that feeds engine outputs to the requests (once)."""
        if self.output_handler is not None:
            return
        # Locals only: the task must not keep this object alive.
        self.output_handler = asyncio.create_task(
            _output_handler(
                self.engine_core, self.output_processor, self._stats, self.logger_manager
            ),
            name="AsyncLLMOutputHandler",
        )

    # ------------------------------------------------------------------
    # EngineClient
    # ------------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        # Not running once the output handler stopped (engine death, shutdown).
        return self.output_handler is None or not self.output_handler.done()

    @property
    def is_stopped(self) -> bool:
        return self.errored

    @property
    def errored(self) -> bool:
        return self.engine_core.resources.engine_dead or not self.is_running

    @property
    def dead_error(self) -> BaseException:
        return EngineDeadError()

    async def get_tokenizer(self) -> TokenizerLike:
        return self.input_processor.get_tokenizer()

    async def get_supported_tasks(self) -> tuple[str, ...]:
        """("generate",), or a pooling model's tasks (its pooler's, asked once)."""
        if self.model_config.runner_type == "generate":
            return ("generate",)
        if self._supported_tasks is None:
            results = await self.engine_core.collective_rpc_async("get_supported_tasks")
            self._supported_tasks = tuple(results[0])
        return self._supported_tasks

    async def is_tracing_enabled(self) -> bool:
        return self.observability_config.tracing_enabled

    async def do_log_stats(self) -> None:
        if self.logger_manager is not None:
            self.logger_manager.log()

    async def check_health(self) -> None:
        logger.debug("Called check_health.")
        if self.errored:
            raise self.dead_error

    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        return await self.engine_core.reset_prefix_cache_async(reset_running_requests)

    async def sleep(self, level: int = 1, mode: str = "abort") -> None:
        """Put the engine to sleep. Mode "abort": the requests in flight end
        with finish_reason "abort"; "wait": they finish first (this returns
        once the engine is asleep); "keep": they are paused and resume after
        `wake_up`. Requests submitted while asleep wait for
        `wake_up`, as upstream."""
        validate_sleep_args(self.vllm_config, level, mode)
        await self.engine_core.sleep_async(level, mode)

    async def wake_up(self, tags: list[str] | None = None) -> None:
        validate_wake_up_tags(self.vllm_config, tags)
        await self.engine_core.wake_up_async(tags)

    async def is_sleeping(self) -> bool:
        return await self.engine_core.is_sleeping_async()

    def get_num_unfinished_requests(self) -> int:
        return self.output_processor.get_num_unfinished_requests()

    # ---- LoRA adapters ----
    async def _ensure_lora_loaded(self, lora_request: LoRARequest) -> None:
        """Load an adapter on its first request, so that a bad one raises
        to the caller (LoRAAdapterNotFoundError, ValueError) with nothing queued."""
        if lora_request.lora_int_id not in self._lora_ids_loaded:
            await self.add_lora(lora_request)

    async def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load a new LoRA adapter into the engine for future requests."""
        loaded = await self.engine_core.add_lora_async(lora_request)
        self._lora_ids_loaded.add(lora_request.lora_int_id)
        return loaded

    async def remove_lora(self, lora_id: int) -> bool:
        """Remove an already loaded LoRA adapter."""
        self._lora_ids_loaded.discard(lora_id)
        return await self.engine_core.remove_lora_async(lora_id)

    async def list_loras(self) -> set[int]:
        """List all registered adapters."""
        return await self.engine_core.list_loras_async()

    async def pin_lora(self, lora_id: int) -> bool:
        """Prevent an adapter from being evicted."""
        return await self.engine_core.pin_lora_async(lora_id)


async def _output_handler(
    engine_core: AsyncMPClient,
    output_processor: OutputProcessor,
    stats: _StatsTracker | None,
    logger_manager: StatLoggerManager | None,
) -> None:
    """Engine-core outputs -> per-request collectors, until the engine dies."""
    try:
        while True:
            outputs = await engine_core.get_output_async()
            num_outputs = len(outputs.outputs)
            iteration_stats = IterationStats() if stats is not None and num_outputs else None
            chunk_size = envs.VLLM_V1_OUTPUT_PROC_CHUNK_SIZE
            for start in range(0, num_outputs, chunk_size):
                chunk = outputs.outputs[start : start + chunk_size]
                if stats is not None and iteration_stats is not None:
                    stats.observe(chunk, outputs.timestamp, iteration_stats)
                processed = output_processor.process_outputs(chunk, outputs.timestamp)
                if processed.reqs_to_abort:
                    # Finished by a stop string here: stop them in the core.
                    await engine_core.abort_requests_async(processed.reqs_to_abort)
                    if stats is not None and iteration_stats is not None:
                        for rid in processed.reqs_to_abort:
                            stats.finish(rid, FinishReason.STOP, iteration_stats)
                if start + chunk_size < num_outputs:
                    # Let other coroutines (HTTP) run between chunks.
                    await asyncio.sleep(0)
            if logger_manager is not None:
                logger_manager.record(
                    outputs.scheduler_stats, iteration_stats, engine_idx=outputs.engine_index
                )
    except Exception as e:
        if isinstance(e, EngineDeadError):
            logger.error("Engine core is dead: failing every pending request.")
        else:
            logger.exception("AsyncLLM output_handler failed.")
        output_processor.propagate_error(e)
