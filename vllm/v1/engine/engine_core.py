"""The engine core: scheduler + executor, one step at a time (upstream:
`EngineCore` in vllm/v1/engine/core.py, which re-exports it from here).

    step():  schedule() -> executor.execute_model() -> [sample_tokens()]
             -> scheduler.update_from_output() -> EngineCoreOutputs per client

With async scheduling the executor can hold `max_concurrent_batches` steps
in flight, and `step_with_batch_queue` schedules step N+1 before it waits for
step N's tokens (the AsyncScheduler counts the missing tokens as placeholders).

Structured outputs: `add_request` starts compiling the request's grammar
(`StructuredOutputManager.grammar_init`, a thread pool); `sample_tokens` gets
the step's grammar bitmask (`Scheduler.get_grammar_bitmask`), which must see
the grammars advanced by every earlier step's tokens - see
`step_with_batch_queue` for how the batch queue keeps that order.

At start-up the core sizes the paged KV cache: the executor reports each
layer's KV spec and the memory it can give the cache, `get_kv_cache_configs`
turns that into a block count and tensor layout, and the workers allocate it.

`EngineCoreProc` (core_proc.py) runs this class in its own process, a busy
loop fed over ZMQ.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeAlias

from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.lora.request import LoRARequest
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import (
    generate_scheduler_kv_cache_config,
    get_kv_cache_configs,
    get_request_block_hasher,
    init_none_hash,
)
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutputs, EngineCoreRequest
from vllm.v1.engine.core_sleep import SleepManager, StepFn
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

if TYPE_CHECKING:
    from vllm.config.cache import CacheConfig
    from vllm.config.scheduler import SchedulerConfig
    from vllm.v1.core.kv_cache_utils import BlockHash
    from vllm.v1.executor.abstract import Executor
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import ModelRunnerOutput

logger = init_logger(__name__)

# A step's forward pass or sampling, launched on the workers (non_block=True).
StepFuture: TypeAlias = "Future[ModelRunnerOutput | None]"


def get_scheduler_cls(scheduler_config: SchedulerConfig) -> type[Scheduler]:
    """The scheduler class the engine core builds: `AsyncScheduler` with async
    scheduling, else `Scheduler`. Resolved here, not in `SchedulerConfig`, so
    that vllm/config stays below vllm/v1 (see .importlinter)."""
    return AsyncScheduler if scheduler_config.async_scheduling else Scheduler


def _make_request_block_hasher(
    cache_config: CacheConfig,
) -> Callable[[Request], list[BlockHash]] | None:
    """The hasher of a request's full blocks, which prefix caching keys on
    (None without prefix caching)."""
    if not cache_config.enable_prefix_caching:
        return None
    hash_fn = get_hash_fn_by_name(cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    return get_request_block_hasher(cache_config.block_size, hash_fn)


class EngineCore:
    """Inner loop of vLLM's engine: owns the scheduler and the model executor.
    Sleep mode (sleep / wake_up / is_sleeping) is its `SleepManager` (core_sleep.py)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        executor_class: type[Executor],
        log_stats: bool,
        executor_fail_callback: Callable[[], None] | None = None,
        include_finished_set: bool = False,
    ) -> None:
        self.vllm_config = vllm_config
        self.log_stats = log_stats
        model_config = vllm_config.model_config
        assert model_config is not None, "an engine core needs a model"
        logger.info(
            "Initializing a V1 LLM engine with config: model=%r, dtype=%s, "
            "max_model_len=%d, block_size=%d, prefix_caching=%s",
            model_config.model,
            model_config.dtype,
            model_config.max_model_len,
            vllm_config.cache_config.block_size,
            vllm_config.cache_config.enable_prefix_caching,
        )

        # 1. Workers: init device, load the model.
        self.model_executor = executor_class(vllm_config)
        if executor_fail_callback is not None:
            self.model_executor.register_failure_callback(executor_fail_callback)

        # 2. Size and allocate the KV cache (profile, plan, allocate, warm up).
        start = time.perf_counter()
        num_gpu_blocks, kv_cache_config = self._initialize_kv_caches(vllm_config)
        vllm_config.cache_config.num_gpu_blocks = num_gpu_blocks
        vllm_config.cache_config.num_cpu_blocks = 0
        logger.info(
            "init engine (profile, create kv cache, warmup model) took %.2f seconds",
            time.perf_counter() - start,
        )

        # 3. The scheduler, and the block hasher that prefix caching keys on.
        self.structured_output_manager = StructuredOutputManager(vllm_config)
        scheduler_cls = get_scheduler_cls(vllm_config.scheduler_config)
        self.scheduler = scheduler_cls(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=self.structured_output_manager,
            # DP load balancing: the front end counts each engine's finished requests.
            include_finished_set=include_finished_set,
            log_stats=self.log_stats,
        )
        self.request_block_hasher = _make_request_block_hasher(vllm_config.cache_config)
        # Speculative decoding: after each step of sync scheduling the runner's
        # new drafts go to the scheduler (post_step). With async scheduling
        # they stay on the workers (the scheduler sends placeholder drafts).
        self.use_spec_decode = vllm_config.speculative_config is not None
        self.async_scheduling = vllm_config.scheduler_config.async_scheduling

        # 4. Steps in flight: more than one only with async scheduling.
        self.batch_queue_size = self.model_executor.max_concurrent_batches
        # (output future, forward-pass future, what was scheduled), newest first.
        self.batch_queue: deque[tuple[StepFuture, StepFuture, SchedulerOutput]] | None = None
        if self.batch_queue_size > 1:
            logger.info("Batch queue is enabled with size %d", self.batch_queue_size)
            self.batch_queue = deque(maxlen=self.batch_queue_size)
        # A scheduled step whose sampling waits for the steps in flight (its
        # grammar bitmask needs their tokens): (forward-pass future, step).
        self._deferred_sampling: tuple[StepFuture, SchedulerOutput] | None = None
        self.step_fn: StepFn = self.step if self.batch_queue is None else self.step_with_batch_queue
        self.sleep_manager = SleepManager(vllm_config, self)
        # Adapter ids every worker loaded successfully (see `add_request`).
        self._lora_ids_loaded: set[int] = set()
        # In process: outputs made outside `step` (see _emit_outputs).
        self._stashed_outputs: list[EngineCoreOutputs] = []

    def _initialize_kv_caches(self, vllm_config: VllmConfig) -> tuple[int, KVCacheConfig]:
        """Plan the KV cache from the workers' specs and free memory; allocate it.

        Returns the number of blocks and the scheduler's view of the layout.
        """
        kv_cache_specs = self.model_executor.get_kv_cache_specs()
        if any(kv_cache_specs):
            available_memory = self.model_executor.determine_available_memory()
        else:
            # Attention-free models keep no KV: nothing to size.
            available_memory = [0] * len(kv_cache_specs)
        kv_cache_configs = get_kv_cache_configs(vllm_config, kv_cache_specs, available_memory)
        scheduler_kv_cache_config = generate_scheduler_kv_cache_config(kv_cache_configs)
        self.model_executor.initialize_from_config(kv_cache_configs)
        return scheduler_kv_cache_config.num_blocks, scheduler_kv_cache_config

    # ------------------------------------------------------------------
    # Requests
    # ------------------------------------------------------------------

    def preprocess_add_request(self, request: EngineCoreRequest) -> tuple[Request, int]:
        """Turn a wire request into the core's `Request` (hashing its full blocks)."""
        req = Request.from_engine_core_request(request, self.request_block_hasher)
        return req, request.current_wave

    def add_request(self, request: Request, request_wave: int = 0) -> None:
        """Queue a request for scheduling."""
        if not isinstance(request.request_id, str):
            raise TypeError(f"request_id must be a string, got {type(request.request_id)}")
        if request.pooling_params is not None:
            task = request.pooling_params.task
            supported = self.get_supported_tasks()
            if task not in supported:
                raise ValueError(f"Unsupported task: {task!r} Supported tasks: {supported}")
        if request.lora_request is not None and self.vllm_config.lora_config is not None:
            self._ensure_lora_loaded(request.lora_request)
        if not self.sleep_manager.hold_request(request):  # held while a "wait" sleep is pending
            self._admit_request(request)

    def _ensure_lora_loaded(self, lora_request: LoRARequest) -> None:
        """Load an adapter the workers have not loaded yet before its first
        request is queued. A bad adapter (missing path, not a peft directory,
        rank above max_lora_rank, unsupported target modules, another base
        model) then fails this request with the loader's error (loading
        nothing) instead of failing a step that serves other requests; the
        front ends do the same first to hand the caller that error. (Upstream
        loads it inside the step.) A known id costs nothing."""
        if lora_request.lora_int_id not in self._lora_ids_loaded:
            self.add_lora(lora_request)

    def get_supported_tasks(self) -> tuple[str, ...]:
        """The tasks the loaded model serves (asked of the workers once)."""
        tasks = getattr(self, "_supported_tasks", None)
        if tasks is None:
            tasks = self._supported_tasks = tuple(self.model_executor.supported_tasks)
        return tasks

    def _admit_request(self, request: Request) -> None:
        if request.use_structured_output:
            # Compiles in the background; the scheduler waits for it.
            self.structured_output_manager.grammar_init(request)
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        """Abort requests (unknown or finished ids are ignored)."""
        self.sleep_manager.abort_held(request_ids)
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    # ------------------------------------------------------------------
    # The step
    # ------------------------------------------------------------------

    def step(self) -> tuple[dict[int, EngineCoreOutputs], bool]:
        """Schedule, execute and make outputs.

        Returns ({client_index: outputs}, whether any token was scheduled).
        """
        # Finished-but-unreported requests still need a step to tell the workers.
        if not self.scheduler.has_requests():
            return {}, False
        scheduler_output = self.scheduler.schedule()
        future = self._launch_forward(scheduler_output)
        # Built while the forward pass runs.
        grammar_output = self.scheduler.get_grammar_bitmask(scheduler_output)
        with self.log_error_detail(scheduler_output):
            forward_output = future.result()
            if forward_output is None:
                # The runner stopped after the forward pass: sample now.
                sampled = self.model_executor.sample_tokens(grammar_output)
                assert sampled is not None and not isinstance(sampled, Future)
                forward_output = sampled
            model_output = forward_output
        engine_core_outputs = self.scheduler.update_from_output(scheduler_output, model_output)
        model_executed = scheduler_output.total_num_scheduled_tokens > 0
        self.post_step(model_executed)
        return engine_core_outputs, model_executed

    def post_step(self, model_executed: bool) -> None:
        """Hand the drafts the runner proposed in the step just processed to
        the scheduler (speculative decoding with sync scheduling)."""
        if self.use_spec_decode and not self.async_scheduling and model_executed:
            draft_token_ids = self.model_executor.take_draft_token_ids()
            if draft_token_ids is not None:
                self.scheduler.update_draft_token_ids(draft_token_ids)

    def step_with_batch_queue(self) -> tuple[dict[int, EngineCoreOutputs] | None, bool]:
        """Schedule and launch a step without waiting for the ones in flight.

        Each call schedules a new step when there is work, and returns
        (None, True) while the oldest step is still running and the queue has
        room; otherwise it waits for the oldest step and returns its outputs.
        Returns (outputs or None, whether a step ran).

        Structured outputs: the bitmask of step N+1 needs the grammars
        advanced by the tokens of the steps still in flight, which only
        their update_from_output does. So a step with structured-output
        requests, scheduled while others are in flight, launches its forward
        pass at once but defers its sample_tokens call (`_deferred_sampling`):
        the in-flight steps are processed first (no new step is scheduled
        meanwhile: the runner takes no second forward pass before sampling),
        then its bitmask is built and its sampling queued. Its forward pass
        still overlaps the processing of the step before.
        """
        batch_queue = self.batch_queue
        assert batch_queue is not None
        model_executed = False
        if (
            self.scheduler.has_requests()
            and self._deferred_sampling is None
            and not self.sleep_manager.paused
        ):  # a "keep" sleep only finishes the steps in flight
            scheduler_output = self.scheduler.schedule()
            exec_future = self._launch_forward(scheduler_output)
            model_executed = scheduler_output.total_num_scheduled_tokens > 0
            if not model_executed:
                batch_queue.appendleft((exec_future, exec_future, scheduler_output))
            elif scheduler_output.has_structured_output_requests and batch_queue:
                self._deferred_sampling = (exec_future, scheduler_output)
            else:
                self._queue_sampling(exec_future, scheduler_output)
                if len(batch_queue) < self.batch_queue_size and not batch_queue[-1][0].done():
                    # Room for another step and the oldest is still running:
                    # go schedule the next one instead of waiting.
                    return None, True
        elif not batch_queue:
            return None, False
        future, exec_future, scheduler_output = batch_queue.pop()

        def wait(_: SchedulerOutput) -> ModelRunnerOutput:
            exec_future.result()  # a failed forward pass raises its own error here
            output = future.result()
            # A sampled step, or one that scheduled no tokens (the runner's empty output).
            assert output is not None
            return output

        model_output = self.execute_model_with_error_logging(wait, scheduler_output)
        outputs = self.scheduler.update_from_output(scheduler_output, model_output)
        if self._deferred_sampling is not None and not batch_queue:
            # Every earlier step is processed: the deferred step may sample.
            deferred, self._deferred_sampling = self._deferred_sampling, None
            self._queue_sampling(*deferred)
        self.post_step(model_executed)
        return outputs, model_executed

    def _queue_sampling(self, exec_future: StepFuture, scheduler_output: SchedulerOutput) -> None:
        """Queue a launched step's sampling behind its forward pass (on the
        worker) and put the step in the batch queue."""
        assert self.batch_queue is not None
        self._fill_in_drafts_for_grammar(scheduler_output)
        grammar_output = self.scheduler.get_grammar_bitmask(scheduler_output)
        future = self.model_executor.sample_tokens(grammar_output, non_block=True)
        assert isinstance(future, Future)  # non_block=True: every executor returns one
        self.batch_queue.appendleft((future, exec_future, scheduler_output))

    def _fill_in_drafts_for_grammar(self, scheduler_output: SchedulerOutput) -> None:
        """Async scheduling with drafts: the bitmask of a structured-output
        request covers each draft position, so it needs the drafts, which
        only the runner has (the step carries placeholders). Every earlier
        step is processed by now (its sampling proposed them), and the
        executor runs this call after the step's forward: the drafts it
        returns are the ones that forward verified (upstream's deferred path
        in step_with_batch_queue)."""
        if not (
            self.use_spec_decode
            and self.async_scheduling
            and scheduler_output.has_structured_output_requests
            and scheduler_output.scheduled_spec_decode_tokens
        ):
            return
        draft_token_ids = self.model_executor.take_draft_token_ids()
        if draft_token_ids is not None:
            self.scheduler.update_draft_token_ids_in_output(draft_token_ids, scheduler_output)

    def _launch_forward(self, scheduler_output: SchedulerOutput) -> StepFuture:
        """Start the step's forward pass; its Future resolves to the output,
        or to None when the runner waits for `sample_tokens`."""
        future = self.model_executor.execute_model(scheduler_output, non_block=True)
        assert isinstance(future, Future)  # non_block=True: every executor returns one
        return future

    def execute_model_with_error_logging(
        self,
        model_fn: Callable[[SchedulerOutput], ModelRunnerOutput],
        scheduler_output: SchedulerOutput,
    ) -> ModelRunnerOutput:
        """Run `model_fn`, logging what was scheduled if it raises."""
        with self.log_error_detail(scheduler_output):
            return model_fn(scheduler_output)

    @contextmanager
    def log_error_detail(self, scheduler_output: SchedulerOutput) -> Iterator[None]:
        try:
            yield
        except Exception:
            logger.error(
                "Model execution failed. Scheduled: %d new requests, %d cached requests, "
                "%d tokens (%s)",
                len(scheduler_output.scheduled_new_reqs),
                scheduler_output.scheduled_cached_reqs.num_reqs,
                scheduler_output.total_num_scheduled_tokens,
                scheduler_output.num_scheduled_tokens,
            )
            raise

    # ------------------------------------------------------------------
    # Sleep mode (SleepManager, core_sleep.py)
    # ------------------------------------------------------------------

    def sleep(self, level: int = 1, mode: str = "abort") -> Future[None] | None:
        """Put the engine to sleep; a Future in mode "wait" while requests
        are in flight (see core_sleep.py for the levels and modes)."""
        return self.sleep_manager.sleep(level, mode)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.sleep_manager.wake_up(tags)

    def is_sleeping(self) -> bool:
        return self.sleep_manager.is_sleeping()

    def _steps_in_flight(self) -> bool:
        """Steps launched but not yet processed (async scheduling)."""
        return bool(self.batch_queue) or self._deferred_sampling is not None

    def _emit_outputs(self, outputs: dict[int, EngineCoreOutputs]) -> None:
        """Outputs made outside `step` (sleep's aborts, the steps finished
        while going to sleep). In process they wait for the client's next
        `get_output` (InprocClient); EngineCoreProc sends them at once."""
        self._stashed_outputs.extend(o for o in outputs.values() if o.outputs)

    def take_stashed_outputs(self) -> list[EngineCoreOutputs]:
        stashed, self._stashed_outputs = self._stashed_outputs, []
        return stashed

    # ------------------------------------------------------------------
    # Utilities
    # ------------------------------------------------------------------

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        return self.scheduler.reset_prefix_cache(reset_running_requests)

    # LoRA adapters (upstream's names): loaded into every worker's CPU cache;
    # a step activates the ones its requests use (at most max_loras).
    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load an adapter for future requests; False if it was loaded already."""
        loaded = self.model_executor.add_lora(lora_request)
        self._lora_ids_loaded.add(lora_request.lora_int_id)
        return loaded

    def remove_lora(self, lora_id: int) -> bool:
        """Unload an adapter; requests still using it reload it from their path."""
        self._lora_ids_loaded.discard(lora_id)
        return self.model_executor.remove_lora(lora_id)

    def list_loras(self) -> set[int]:
        return self.model_executor.list_loras()

    def pin_lora(self, lora_id: int) -> bool:
        """Keep an adapter loaded: never evicted from the caches."""
        return self.model_executor.pin_lora(lora_id)

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        return self.model_executor.collective_rpc(method, timeout, args, kwargs)

    def shutdown(self) -> None:
        if getattr(self, "model_executor", None) is not None:
            self.model_executor.shutdown()
        if getattr(self, "scheduler", None) is not None:
            self.scheduler.shutdown()
        if getattr(self, "structured_output_manager", None) is not None:
            self.structured_output_manager.clear_backend()
