"""The worker side of the multiprocess executor: what runs in each worker
process (upstream keeps `WorkerProc` in vllm/v1/executor/multiproc_executor.py,
next to the executor; here that module holds only what runs in the engine core
process, and this one what runs in the workers).

Start-up handshake, over a one-way pipe per worker carrying msgpack bytes:
the worker builds its `Worker`, attaches to the broadcast queue, creates its
response queue and sends {"status": "READY", "handle": <queue handle>} (or
"FAILED" with the error), then serves calls until told to stop or killed.
"""

from __future__ import annotations

import ctypes
import enum
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for_connections
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

import msgspec

from vllm.distributed.device_communicators.shm_broadcast import (
    Handle,
    MessageQueue,
    decode_handle,
    encode_handle,
)
from vllm.exceptions import LoRAAdapterNotFoundError, VLLMNotFoundError
from vllm.logger import init_logger
from vllm.utils.system_utils import get_mp_context, parent_only, set_process_title
from vllm.v1.outputs import AsyncModelRunnerOutput
from vllm.v1.worker.worker_base import WorkerWrapperBase

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Linux: have the kernel send `sig` to this process when its parent exits."""
    if sys.platform != "linux":
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        logger.warning("prctl(PR_SET_PDEATHSIG) unavailable; relying on the pipe watcher.")


def watch_parent_pipe(death_pipe: Connection) -> None:
    """Exit at once when the parent's end of `death_pipe` closes (it died):
    a portable backstop for PR_SET_PDEATHSIG. The main thread may be stuck in
    a collective, so this does not wait for it."""

    def wait() -> None:
        with suppress(EOFError, OSError):
            death_pipe.recv_bytes()
        os._exit(1)

    threading.Thread(target=wait, daemon=True, name="WorkerParentWatcher").start()


def cpu_threads_per_worker(world_size: int) -> int:
    """Intra-op threads per worker so that the workers together use each core once."""
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    return max(1, cores // world_size)


@contextmanager
def _worker_env(world_size: int) -> Iterator[None]:
    """OMP_NUM_THREADS for the children (unless the user set it), restored after."""
    old = os.environ.get("OMP_NUM_THREADS")
    if old is None:
        os.environ["OMP_NUM_THREADS"] = str(cpu_threads_per_worker(world_size))
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("OMP_NUM_THREADS", None)


def shutdown_processes(
    procs: list[BaseProcess], death_writers: list[Connection], grace_s: float = 4.0
) -> None:
    """SIGTERM the processes, wait up to `grace_s`, SIGKILL what is left."""
    for writer in death_writers:
        with suppress(OSError):
            writer.close()  # the children's watchers exit on this alone
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(1.0)


@dataclass
class WorkerProcHandle:
    """The executor's view of a started worker process."""

    rank: int
    proc: BaseProcess
    ready_reader: Connection
    death_writer: Connection


class WorkerProc:
    """One worker process: a `Worker` serving the executor's broadcast calls."""

    class ResponseStatus(enum.IntEnum):
        SUCCESS = 0
        FAILURE = 1

    def __init__(
        self,
        vllm_config: VllmConfig,
        local_rank: int,
        rank: int,
        distributed_init_method: str,
        input_handle: Handle,
    ) -> None:
        self.rank = rank
        # Attach to the broadcast queue first: the executor waits for every
        # reader's subscription before anything else.
        self.rpc_broadcast_mq = MessageQueue.create_from_handle(input_handle, rank)
        self.rpc_broadcast_mq.wait_until_ready()
        self.worker = WorkerWrapperBase(vllm_config, rpc_rank=rank)
        world_size = vllm_config.parallel_config.world_size
        all_kwargs: list[dict[str, Any]] = [{} for _ in range(world_size)]
        all_kwargs[rank] = dict(
            vllm_config=vllm_config,
            local_rank=local_rank,
            rank=rank,
            distributed_init_method=distributed_init_method,
            is_driver_worker=rank == 0,
        )
        self.worker.init_worker(all_kwargs)
        self.worker.init_device()
        self.worker.load_model()
        self.worker_response_mq = MessageQueue(1, 1)

    # ---- executor side ------------------------------------------------------------------
    @staticmethod
    def start_workers(
        vllm_config: VllmConfig, world_size: int, init_method: str, input_handle: Handle
    ) -> list[WorkerProcHandle]:
        context = get_mp_context()
        handles = []
        with _worker_env(world_size):
            for rank in range(world_size):
                ready_reader, ready_writer = context.Pipe(duplex=False)
                death_reader, death_writer = context.Pipe(duplex=False)
                parent_only(death_writer)
                proc = context.Process(
                    target=WorkerProc.worker_main,
                    name=f"VllmWorker-{rank}",
                    daemon=True,
                    kwargs=dict(
                        vllm_config=vllm_config,
                        local_rank=rank,
                        rank=rank,
                        distributed_init_method=init_method,
                        input_handle=encode_handle(input_handle),
                        ready_pipe=ready_writer,
                        death_pipe=death_reader,
                    ),
                )
                proc.start()
                ready_writer.close()
                death_reader.close()
                handles.append(WorkerProcHandle(rank, proc, ready_reader, death_writer))
        return handles

    @staticmethod
    def wait_for_ready(
        workers: list[WorkerProcHandle], timeout: float, cancel: threading.Event | None = None
    ) -> list[MessageQueue]:
        """Each worker's response queue (reader side), in rank order."""
        pending = {w.ready_reader: w for w in workers}
        handles: dict[int, Handle] = {}
        deadline = time.monotonic() + timeout
        while pending:
            ready = wait_for_connections(list(pending), max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError("Worker processes did not report ready in time.")
            for conn in [c for c in pending if c in ready]:
                worker = pending.pop(conn)
                try:
                    msg = msgspec.msgpack.decode(conn.recv_bytes())
                except EOFError:
                    worker.proc.join(timeout=1.0)  # reap it, so its exit code is known
                    raise RuntimeError(
                        f"WorkerProc initialization failed: worker {worker.rank} (exit code "
                        f"{worker.proc.exitcode}) died during start-up; see its log above. A "
                        "script that starts vLLM with several workers must guard its entry "
                        'point with `if __name__ == "__main__":` (workers may be spawned).'
                    ) from None
                if msg.get("status") != "READY":
                    raise RuntimeError(f"Worker {worker.rank} failed to start: {msg.get('error')}")
                handles[worker.rank] = decode_handle(msg["handle"])
                conn.close()
        mqs = [MessageQueue.create_from_handle(handles[w.rank], 0) for w in workers]
        for mq in mqs:
            mq.wait_until_ready(timeout=timeout, cancel=cancel)
        return mqs

    # ---- worker side --------------------------------------------------------------------
    @staticmethod
    def worker_main(
        *,
        vllm_config: VllmConfig,
        local_rank: int,
        rank: int,
        distributed_init_method: str,
        input_handle: bytes,
        ready_pipe: Connection,
        death_pipe: Connection,
    ) -> None:
        """Entry point of a worker process."""
        set_process_title(f"VllmWorker-{rank}")
        set_parent_death_signal()
        watch_parent_pipe(death_pipe)
        # SIGTERM from the executor: exit now (the main thread may be inside a collective).
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        try:
            proc = WorkerProc(
                vllm_config, local_rank, rank, distributed_init_method, decode_handle(input_handle)
            )
            ready_pipe.send_bytes(
                msgspec.msgpack.encode(
                    {
                        "status": "READY",
                        "handle": encode_handle(proc.worker_response_mq.export_handle()),
                    }
                )
            )
        except Exception as e:
            logger.exception("Worker %d failed to start.", rank)
            ready_pipe.send_bytes(msgspec.msgpack.encode({"status": "FAILED", "error": repr(e)}))
            return
        finally:
            ready_pipe.close()
        proc.worker_response_mq.wait_until_ready()
        proc.worker_busy_loop()

    def worker_busy_loop(self) -> None:
        """Serve (method, args, kwargs, output_rank) calls until "shutdown"."""
        while True:
            method, args, kwargs, output_rank = self.rpc_broadcast_mq.dequeue()
            try:
                if not isinstance(method, str):
                    raise TypeError("RPC methods are called by name.")
                output = getattr(self.worker, method)(*args, **kwargs)
                if isinstance(output, AsyncModelRunnerOutput):
                    output = output.get_output()
                response = (WorkerProc.ResponseStatus.SUCCESS, output)
            except Exception as e:
                logger.exception("Worker %d: %s failed.", self.rank, method)
                response = (WorkerProc.ResponseStatus.FAILURE, encode_failure(e))
            if output_rank is None or output_rank == self.rank:
                self.worker_response_mq.enqueue(response)
            if method == "shutdown":
                return


# ---- failures of RPC calls -----------------------------------------------------------
# Errors a worker call may raise that the executor raises again as the same
# kind (a bad LoRA adapter in add_lora, a bad argument), tested in order:
# subclasses first. Anything else is a RuntimeError naming the worker. The
# response queue carries msgpack, not pickle: a failure travels as a dict.
_ERROR_KINDS: tuple[tuple[str, type[Exception]], ...] = (
    ("not_found", VLLMNotFoundError),
    ("value", ValueError),
    ("type", TypeError),
    ("not_implemented", NotImplementedError),
)


def encode_failure(e: Exception) -> dict[str, Any]:
    """A failed call's response: {"kind", "message", "detail" (repr and
    traceback), "lora": [name, path] for LoRAAdapterNotFoundError}."""
    failure: dict[str, Any] = {
        "kind": next((kind for kind, cls in _ERROR_KINDS if isinstance(e, cls)), None),
        "message": str(e),
        "detail": f"{e!r}\n{traceback.format_exc()}",
    }
    if isinstance(e, LoRAAdapterNotFoundError):
        failure["lora"] = [e.lora_name, e.lora_path]
    return failure


def decode_failure(rank: int, method: str, failure: Any) -> Exception:
    """The exception the executor raises for a worker's failed call."""
    if not isinstance(failure, dict):
        return RuntimeError(f"Worker {rank} failed in {method}: {failure}")
    if failure.get("lora") is not None:
        name, path = failure["lora"]
        return LoRAAdapterNotFoundError(name, path)
    error_cls = dict(_ERROR_KINDS).get(failure.get("kind") or "")
    if error_cls is None:
        return RuntimeError(f"Worker {rank} failed in {method}: {failure.get('detail')}")
    return error_cls(failure.get("message"))
