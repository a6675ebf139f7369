"""One worker process per rank on this node (upstream: vllm/v1/executor/multiproc_executor.py).

    engine core --rpc_broadcast_mq--> WorkerProc 0 .. N-1 (spawned)
    engine core <--worker_response_mq-- each WorkerProc

Every call is broadcast to all workers as (method name, args, kwargs,
output_rank) through a shared-memory `MessageQueue`; each worker runs it and
answers on its own queue only if it is the output rank (or when every rank
answers). Methods travel by name: there is no way to ship code to a worker.

Failure handling: a monitor thread waits on the worker processes' sentinels.
If one exits while the executor is live, the executor marks itself failed,
cancels every pending response wait (callers get an error at once), kills the
remaining workers and runs the failure callback (the engine core then dies
and its clients raise EngineDeadError). Workers in turn die with their parent:
PR_SET_PDEATHSIG on Linux plus a watcher on a pipe from the parent.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import wait as wait_for_processes
from typing import TYPE_CHECKING, Any

from vllm.distributed.device_communicators.shm_broadcast import MessageQueue
from vllm.distributed.utils import get_distributed_init_method, get_open_port
from vllm.logger import init_logger
from vllm.v1.executor.abstract import Executor
from vllm.v1.executor.worker_proc import (
    WorkerProc,
    WorkerProcHandle,
    decode_failure,
    shutdown_processes,
)

if TYPE_CHECKING:
    from vllm.v1.outputs import DraftTokenIds

logger = init_logger(__name__)

# Seconds to wait for the workers to load the model and report ready.
WORKER_READY_TIMEOUT_S = 600


class MultiprocExecutor(Executor):
    """Executor over `world_size` spawned worker processes on this node."""

    supports_pp: bool = True

    def _init_executor(self) -> None:
        self.is_failed = False
        self.shutting_down = False
        self.shutdown_event = threading.Event()
        self.failure_callback: Callable[[], None] | None = None
        self.world_size = self.parallel_config.world_size
        init_method = get_distributed_init_method("127.0.0.1", get_open_port())
        self.rpc_broadcast_mq = MessageQueue(self.world_size, self.world_size)
        self._rpc_lock = threading.Lock()
        self.workers: list[WorkerProcHandle] = []
        self._finalizer = weakref.finalize(self, shutdown_processes, [], [])
        try:
            self.workers = WorkerProc.start_workers(
                self.vllm_config,
                self.world_size,
                init_method,
                self.rpc_broadcast_mq.export_handle(),
            )
            self._finalizer.detach()
            self._finalizer = weakref.finalize(
                self,
                shutdown_processes,
                [w.proc for w in self.workers],
                [w.death_writer for w in self.workers],
            )
            self.response_mqs = self._wait_for_workers()
        except BaseException:
            self.shutdown()
            raise
        self.io_thread_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mp_exec_io")
        self._start_worker_monitor()

    def _wait_for_workers(self) -> list[MessageQueue]:
        """Both start-up handshakes (every worker subscribed to the broadcast
        queue, then each one's READY with its response queue). A worker that
        exits first fails start-up at once with its own report, instead of
        the parent waiting out WORKER_READY_TIMEOUT_S (e.g. spawn's bootstrap
        error when the main script lacks `if __name__ == "__main__":`)."""
        procs = [w.proc for w in self.workers]
        died, done = threading.Event(), threading.Event()

        def watch() -> None:
            while not done.wait(0.1):
                if any(p.exitcode is not None for p in procs):
                    died.set()
                    return

        threading.Thread(target=watch, daemon=True, name="MultiprocStartupWatch").start()
        try:
            self.rpc_broadcast_mq.wait_until_ready(timeout=WORKER_READY_TIMEOUT_S, cancel=died)
            return WorkerProc.wait_for_ready(self.workers, WORKER_READY_TIMEOUT_S, cancel=died)
        except RuntimeError as e:
            if str(e) != "cancelled":
                raise
            # The dead worker's pipe holds its report (FAILED) or its EOF:
            # this raises the specific error.
            WorkerProc.wait_for_ready(self.workers, 5.0)
            raise RuntimeError("WorkerProc initialization failed.") from None
        finally:
            done.set()

    # ---- failure detection -------------------------------------------------------------
    def _start_worker_monitor(self) -> None:
        procs = [w.proc for w in self.workers]
        self_ref = weakref.ref(self)

        def monitor() -> None:
            dead = wait_for_processes([p.sentinel for p in procs])
            executor = self_ref()
            if executor is None or executor.shutting_down:
                return
            names = [f"{p.name} (exit code {p.exitcode})" for p in procs if p.sentinel in dead]
            logger.error(
                "Worker process(es) %s died unexpectedly; shutting down the executor.",
                ", ".join(names),
            )
            executor.is_failed = True
            executor.shutdown_event.set()  # fail every pending response wait
            executor.shutdown()
            if executor.failure_callback is not None:
                executor.failure_callback()

        threading.Thread(target=monitor, daemon=True, name="MultiprocWorkerMonitor").start()

    def register_failure_callback(self, callback: Callable[[], None]) -> None:
        if self.is_failed:
            callback()
        else:
            self.failure_callback = callback

    # ---- RPC -------------------------------------------------------------------------
    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        non_block: bool = False,
        unique_reply_rank: int | None = None,
    ) -> Any:
        """Run worker method `method` (a name) on every rank. Returns the
        results in rank order, or only rank `unique_reply_rank`'s result (not
        in a list) when given; a Future of that with `non_block`."""
        if not isinstance(method, str):
            raise TypeError(
                "MultiprocExecutor calls worker methods by name; functions "
                "cannot be sent to worker processes."
            )
        if self.is_failed or self.shutting_down:
            raise RuntimeError("Executor failed." if self.is_failed else "Executor is shut down.")
        with self._rpc_lock:  # broadcast order == response order
            try:
                # A dead worker stops reading: do not wait on it for ever.
                self.rpc_broadcast_mq.enqueue(
                    (method, tuple(args), kwargs or {}, unique_reply_rank),
                    cancel=self.shutdown_event,
                )
            except RuntimeError as e:
                raise RuntimeError("Executor failed: a worker process died.") from e
            ranks = range(self.world_size) if unique_reply_rank is None else [unique_reply_rank]
            future = self.io_thread_pool.submit(
                self._get_responses, method, list(ranks), timeout, unique_reply_rank is not None
            )
        return future if non_block else future.result()

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        # Only the output rank replies (its drafts are every rank's).
        return self.collective_rpc("take_draft_token_ids", unique_reply_rank=self.output_rank)

    def _step_rpc(self, method: str, arg: Any, non_block: bool) -> Any:
        """Only `output_rank` replies to a step, and its result comes back as is."""
        return self.collective_rpc(
            method, args=(arg,), non_block=non_block, unique_reply_rank=self.output_rank
        )

    def _get_responses(
        self, method: str, ranks: list[int], timeout: float | None, single: bool
    ) -> Any:
        results = []
        failure: Exception | None = None
        for rank in ranks:
            try:
                status, result = self.response_mqs[rank].dequeue(
                    timeout=timeout, cancel=self.shutdown_event
                )
            except TimeoutError as e:
                raise TimeoutError(f"RPC call to {method} timed out.") from e
            except RuntimeError as e:
                raise RuntimeError("Executor failed: a worker process died.") from e
            if status != WorkerProc.ResponseStatus.SUCCESS and failure is None:
                # The worker's error kind (ValueError, a missing LoRA adapter, ...),
                # else a RuntimeError with its traceback.
                failure = decode_failure(rank, method, result)
            results.append(result)
        # Raised only once every rank has answered: a reply left in a queue
        # would be read as the answer to the next call.
        if failure is not None:
            raise failure
        return results[0] if single else results

    # ---- properties and lifecycle ---------------------------------------------------------
    @property
    def max_concurrent_batches(self) -> int:
        """The engine core's batch queue size (`VllmConfig.max_concurrent_batches`:
        pp, or under async scheduling pp + 1 with V2 and 2 with V1 at pp = 1)."""
        return self.vllm_config.max_concurrent_batches

    @classmethod
    def supports_async_scheduling(cls) -> bool:
        return True

    def check_health(self) -> None:
        if self.is_failed:
            raise RuntimeError("Executor failed: a worker process died.")
        self.collective_rpc("check_health", timeout=10)

    def shutdown(self) -> None:
        """Stop the workers (SIGTERM, then SIGKILL) and release the queues."""
        if self.shutting_down:
            return
        self.shutting_down = True
        self.shutdown_event.set()
        self._finalizer()
        if (pool := getattr(self, "io_thread_pool", None)) is not None:
            # Its pending wait ends within ~10 ms of shutdown_event; let it
            # release the queue buffers before they are closed.
            pool.shutdown(wait=True, cancel_futures=True)
        if (mq := getattr(self, "rpc_broadcast_mq", None)) is not None:
            mq.close()
        for mq in getattr(self, "response_mqs", []):
            mq.close(unlink=True)  # the workers are gone and cannot unlink them
        self.response_mqs = []
        self.rpc_broadcast_mq = None  # type: ignore[assignment]
