"""One worker in the engine core's own process (upstream:
vllm/v1/executor/uniproc_executor.py).

Calls are plain method calls on the worker; under async scheduling they run
on one worker thread, so `execute_model(non_block=True)` returns a Future
while the engine core goes on scheduling.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from vllm.v1.executor.abstract import Executor
from vllm.v1.outputs import AsyncModelRunnerOutput
from vllm.v1.worker.worker_base import WorkerWrapperBase, run_method

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
    from vllm.v1.outputs import ModelRunnerOutput


class UniProcExecutor(Executor):
    """Calls the single worker directly.

    Without async scheduling a non-blocking call runs to completion before
    returning and hands back an already-completed Future (with the exception
    set if the call raised). With async scheduling every call goes, in order,
    through one worker thread, so a non-blocking `execute_model` returns at
    once and the engine core schedules step N+1 while step N computes (torch
    releases the GIL inside its kernels).
    """

    def _init_executor(self) -> None:
        self._async = bool(self.vllm_config.scheduler_config.async_scheduling)
        # One thread: calls run in submission order, as they would on a remote worker.
        self._thread = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-worker")
            if self._async
            else None
        )
        self.driver_worker = WorkerWrapperBase(vllm_config=self.vllm_config, rpc_rank=0)
        self.driver_worker.init_worker(
            all_kwargs=[
                dict(
                    vllm_config=self.vllm_config,
                    local_rank=0,
                    rank=0,
                    distributed_init_method="",
                    is_driver_worker=True,
                )
            ]
        )
        self.driver_worker.init_device()
        self.driver_worker.load_model()

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        non_block: bool = False,
        single_value: bool = False,
    ) -> Any:
        """As `Executor.collective_rpc`; with `single_value` the worker's result
        is returned as is instead of in a one-element list."""
        kwargs = kwargs or {}
        if self._thread is not None:
            future = self._thread.submit(self._call, method, args, kwargs)
            if not single_value:
                future = _map_future(future, lambda r: [r])
            return future if non_block else future.result()
        if not non_block:
            result = self._call(method, args, kwargs)
            return result if single_value else [result]
        future = Future()
        try:
            result = self._call(method, args, kwargs)
        except Exception as e:
            future.set_exception(e)
        else:
            future.set_result(result if single_value else [result])
        return future

    def _call(self, method: str | Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        result = run_method(self.driver_worker, method, args, kwargs)
        if isinstance(result, AsyncModelRunnerOutput):
            # Resolve on the worker side (the worker thread when async), so the
            # engine core's future yields a plain ModelRunnerOutput.
            result = result.get_output()
        return result

    def execute_model(
        self, scheduler_output: SchedulerOutput, non_block: bool = False
    ) -> ModelRunnerOutput | None | Future[ModelRunnerOutput | None]:
        return self.collective_rpc(
            "execute_model", args=(scheduler_output,), non_block=non_block, single_value=True
        )

    def sample_tokens(
        self, grammar_output: GrammarOutput | None, non_block: bool = False
    ) -> ModelRunnerOutput | None | Future[ModelRunnerOutput | None]:
        return self.collective_rpc(
            "sample_tokens", args=(grammar_output,), non_block=non_block, single_value=True
        )

    def check_health(self) -> None:
        # The worker lives in this process: it is healthy as long as we run.
        return

    @property
    def max_concurrent_batches(self) -> int:
        return 2 if self._async else 1

    @classmethod
    def supports_async_scheduling(cls) -> bool:
        return True

    def shutdown(self) -> None:
        if (thread := getattr(self, "_thread", None)) is not None:
            thread.shutdown(wait=True)
        if (worker := getattr(self, "driver_worker", None)) is not None:
            worker.shutdown()


def _map_future(future: Future[Any], fn: Callable[[Any], Any]) -> Future[Any]:
    """A future resolving to fn(result of `future`), or to its exception."""
    mapped: Future[Any] = Future()

    def done(f: Future[Any]) -> None:
        if (e := f.exception()) is not None:
            mapped.set_exception(e)
        else:
            mapped.set_result(fn(f.result()))

    future.add_done_callback(done)
    return mapped
