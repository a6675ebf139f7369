"""Sleep mode of the engine core (upstream: `EngineCore.sleep` / `wake_up` /
`is_sleeping`, with the pause states of `pause_scheduler`): `SleepManager`,
a part each `EngineCore` owns, whose sleep methods delegate to it.

    sleep(level, mode):  pause scheduling; level 1 then gives back the KV
                         cache (the prefix cache is reset first), level 2 the
                         weights too (Executor.sleep -> Worker.sleep); level 0
                         only pauses.
        mode "abort":    the requests in flight end at once with
                         finish_reason "abort" (upstream's default).
        mode "wait":     they run to completion first; requests that arrive
                         meanwhile are held (not scheduled). The call returns
                         a Future, resolved when the engine is asleep.
        mode "keep":     they are paused and kept: the steps in flight
                         finish, and at level 1+ the running ones are
                         preempted (their KV cache is freed); after wake_up
                         they resume (recomputing what was preempted).
    wake_up(tags):       take back "weights" / "kv_cache" (None: all);
                         scheduling resumes once nothing is asleep.

Requests that arrive while the engine sleeps are accepted and wait for
wake_up, as upstream. The front ends (LLMEngine, AsyncLLM) call
`validate_sleep_args` / `validate_wake_up_tags` before anything is sent, so a
bad argument is a ValueError (a 400 on the server) there.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from vllm.logger import init_logger
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
from vllm.v1.request import RequestStatus

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.executor.abstract import Executor
    from vllm.v1.request import Request

logger = init_logger(__name__)

# Steps sleep() may take to let the workers drop the aborted requests.
_MAX_DRAIN_STEPS = 64
SLEEP_LEVELS = (0, 1, 2)
SLEEP_MODES = ("abort", "wait", "keep")
WAKE_UP_TAGS = ("weights", "kv_cache", "scheduling")

# EngineCore.step / step_with_batch_queue: ({client_index: outputs} or None, whether a step ran).
StepFn = Callable[[], tuple[dict[int, EngineCoreOutputs] | None, bool]]


class SleepHost(Protocol):
    """What `SleepManager` uses of the engine core that owns it (`EngineCore`)."""

    @property
    def scheduler(self) -> Scheduler: ...

    @property
    def model_executor(self) -> Executor: ...

    @property
    def step_fn(self) -> StepFn: ...

    def _steps_in_flight(self) -> bool: ...

    def _admit_request(self, request: Request) -> None: ...

    def _emit_outputs(self, outputs: dict[int, EngineCoreOutputs]) -> None: ...


class SleepManager:
    """The sleep mode of one engine core: its pause state and the requests it
    holds. `EngineCore.sleep` / `wake_up` / `is_sleeping` delegate here; the
    core asks `paused` before scheduling and `hold_request` before admitting."""

    def __init__(self, vllm_config: VllmConfig, core: SleepHost) -> None:
        self.vllm_config = vllm_config
        self.core = core
        # No step is scheduled while paused.
        self.paused = False
        # Mode "wait": (level, future) until the requests in flight finish;
        # requests that arrive meanwhile are held here, unscheduled.
        self._pending_sleep: tuple[int, Future[None]] | None = None
        self._held_requests: list[Request] = []

    @property
    def sleep_pending(self) -> bool:
        """A "wait" sleep waits for the requests in flight."""
        return self._pending_sleep is not None

    def sleep(self, level: int = 1, mode: str = "abort") -> Future[None] | None:
        """Put the engine to sleep (see the module docstring). Returns a
        Future in mode "wait" while requests are in flight, else None."""
        validate_sleep_args(self.vllm_config, level, mode)
        if self._pending_sleep is not None:
            raise ValueError("A sleep is already waiting for the requests in flight.")
        if mode == "wait" and self._has_steps_left():
            future: Future[None] = Future()
            self._pending_sleep = (level, future)
            logger.info("Waiting for in-flight requests to complete before sleeping...")
            return future
        if mode == "keep":
            self.paused = True  # from here on nothing new is scheduled
            self._finish_steps_in_flight()
            if level >= 1:
                # Preempt the running requests: they give up their blocks.
                self.core.scheduler.reset_prefix_cache(reset_running_requests=True)
        else:
            if mode == "abort":
                self._abort_all()
            self._drain()  # steps that tell the workers what finished
            self.paused = True
        self._fall_asleep(level)
        return None

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Take back the memory of `tags` ("weights", "kv_cache"; None: all)
        and resume scheduling once nothing is asleep ("scheduling" resumes
        after a level-0 sleep)."""
        validate_wake_up_tags(self.vllm_config, tags)
        if self._pending_sleep is not None:
            # Woken before it fell asleep: the sleep is called off.
            _, future = self._pending_sleep
            self._pending_sleep = None
            future.set_exception(
                RuntimeError(
                    "wake_up was called before the engine fell asleep (sleep mode 'wait')."
                )
            )
        executor = self.core.model_executor
        memory_tags = None if tags is None else [t for t in tags if t != "scheduling"]
        if memory_tags is None or memory_tags:
            executor.wake_up(memory_tags)
        if executor.is_sleeping:
            # Upstream resumes anyway; a step without weights or KV cache
            # would fail, so scheduling waits for the rest of the wake-up.
            logger.info(
                "Still asleep: %s; scheduling resumes when they wake up.",
                sorted(executor.sleeping_tags),
            )
            return
        self.paused = False
        held, self._held_requests = self._held_requests, []
        for request in held:
            self.core._admit_request(request)
        logger.info("Engine awake.")

    def is_sleeping(self) -> bool:
        return self.paused or self.sleep_pending or self.core.model_executor.is_sleeping

    def hold_request(self, request: Request) -> bool:
        """Hold a new request while a "wait" sleep is pending (True if held)."""
        if self._pending_sleep is None:
            return False
        logger.info("Engine is going to sleep: request %s waits for wake_up.", request.request_id)
        self._held_requests.append(request)
        return True

    def abort_held(self, request_ids: list[str]) -> None:
        ids = set(request_ids)
        self._held_requests = [r for r in self._held_requests if r.request_id not in ids]

    def maybe_fall_asleep(self) -> None:
        """Mode "wait": fall asleep once the requests in flight are done."""
        if self._pending_sleep is None or self._has_steps_left():
            return
        level, future = self._pending_sleep
        self._pending_sleep = None
        self.paused = True
        try:
            self._fall_asleep(level)
        except Exception as e:
            future.set_exception(e)
            return
        future.set_result(None)

    # ---- helpers ----------------------------------------------------------------------
    def _has_steps_left(self) -> bool:
        return self.core.scheduler.has_requests() or self.core._steps_in_flight()

    def _fall_asleep(self, level: int) -> None:
        if level >= 1:
            # The KV cache's content is about to be forgotten.
            if not self.core.scheduler.reset_prefix_cache():
                raise RuntimeError("The prefix cache could not be reset before sleeping.")
            self.core.model_executor.sleep(level)
        logger.info("Engine asleep (level %d).", level)

    def _abort_all(self) -> None:
        """Abort every request, held ones included, and tell their clients."""
        scheduler = self.core.scheduler
        aborted = [r for r in scheduler.requests.values() if not r.is_finished()]
        aborted += self._held_requests
        self._held_requests = []
        scheduler.finish_requests(None, RequestStatus.FINISHED_ABORTED)
        by_client: dict[int, list[EngineCoreOutput]] = {}
        for request in aborted:
            by_client.setdefault(request.client_index, []).append(
                EngineCoreOutput(
                    request_id=request.request_id,
                    new_token_ids=[],
                    finish_reason=FinishReason.ABORT,
                )
            )
        outputs = {i: EngineCoreOutputs(outputs=outs) for i, outs in by_client.items()}
        self.core._emit_outputs(outputs)

    def _drain(self) -> None:
        """Step until the workers dropped the finished requests and no step
        is in flight (nothing new is scheduled: no request is left)."""
        self._step_while(self._has_steps_left, "drain its steps")

    def _finish_steps_in_flight(self) -> None:
        """Mode "keep": process the steps launched under async scheduling
        (while paused, step_with_batch_queue schedules nothing new)."""
        self._step_while(self.core._steps_in_flight, "finish its steps in flight")

    def _step_while(self, more: Callable[[], bool], what: str) -> None:
        for _ in range(_MAX_DRAIN_STEPS):
            if not more():
                return
            outputs, _ = self.core.step_fn()
            self.core._emit_outputs(outputs or {})
        raise RuntimeError(f"The engine did not {what} before sleeping.")


def validate_sleep_args(vllm_config: VllmConfig, level: Any, mode: Any) -> None:
    """ValueError (a 400 on the server) for a sleep this engine cannot do."""
    _require_sleep_mode(vllm_config)
    if type(level) is not int or level not in SLEEP_LEVELS:
        raise ValueError(f"Sleep level must be one of {list(SLEEP_LEVELS)}, got {level!r}.")
    if mode not in SLEEP_MODES:
        raise ValueError(f"Sleep mode must be one of {list(SLEEP_MODES)}, got {mode!r}.")
    if level >= 1:
        from vllm.v1.worker.worker_sleep import check_sleep_supported

        check_sleep_supported(vllm_config, level)


def validate_wake_up_tags(vllm_config: VllmConfig, tags: Any) -> None:
    _require_sleep_mode(vllm_config)
    if tags is None:
        return
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ValueError(f"Wake-up tags must be a list of strings, got {tags!r}.")
    unknown = sorted(set(tags) - set(WAKE_UP_TAGS))
    if unknown:
        raise ValueError(f"Unknown wake-up tags {unknown}; the tags are {list(WAKE_UP_TAGS)}.")


def _require_sleep_mode(vllm_config: VllmConfig) -> None:
    model_config = vllm_config.model_config
    if model_config is None or not model_config.enable_sleep_mode:
        raise ValueError(
            "Sleep mode is not enabled: start the engine with "
            "enable_sleep_mode=True (--enable-sleep-mode)."
        )
