"""V1 helpers at upstream's module path (upstream: vllm/v1/utils.py), and the
processes of a multi-API-server `vllm serve --api-server-count N`:

    parent (serve.py run_multi_api_server)
      bind the HTTP socket once -> launch the engine core(s)
      -> APIServerProcessManager: N spawned API servers, each given the
         socket, its own ZMQ input/output address pair and its client index
      -> wait_for_completion_or_failure: block until a process exits;
         any exit (an API server, an engine, the coordinator) stops them all.

Deviation from upstream: `APIServerProcessManager` takes the child's entry
point (`target_server_fn`) from its caller; upstream defaults it to a
function here that imports the API server, but this module is imported by
the KV-cache code, below the server, and that import would close a cycle.
"""

from __future__ import annotations

import argparse
import socket
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from multiprocessing import connection
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

import torch

from vllm.logger import init_logger
from vllm.utils import ConstantList
from vllm.utils.system_utils import parent_only
from vllm.utils.warm_spawn import WARM_API_SERVER_CONTEXT

logger = init_logger(__name__)


def tensor_data(tensor: torch.Tensor) -> memoryview:
    """The raw bytes of a tensor (any dtype, on CPU, contiguous), for hashing
    and serializing."""
    return tensor.flatten().cpu().contiguous().view(torch.uint8).numpy().data


class APIServerProcessManager:
    """Starts N API server processes that share one listening socket and
    stops them (`shutdown`, also run when the manager is collected).

    Child i runs `target_server_fn(listen_address, sock, args, client_config)`
    with client_config = {"input_address", "output_address", "client_count",
    "client_index", ["stats_update_address"]}, plus "death_pipe": the read
    end of a pipe whose write end only this process holds, so that a child
    notices when the parent is gone (even SIGKILLed) and exits too.

    Deviation from upstream: the servers are started once the engine cores
    are ready, and `engine_ready_info` (the engines' num_gpu_blocks and
    max_model_len from their READY handshake) goes to each in client_config
    under "engine_ready_info"; upstream starts them alongside the engines
    and has each engine send that in its first message to every client.
    """

    def __init__(
        self,
        target_server_fn: Callable[..., None],
        listen_address: str,
        sock: socket.socket,
        args: argparse.Namespace,
        num_servers: int,
        input_addresses: Sequence[str],
        output_addresses: Sequence[str],
        stats_update_address: str | None = None,
        engine_ready_info: dict[str, int] | None = None,
    ) -> None:
        if not len(input_addresses) == len(output_addresses) == num_servers:
            raise ValueError(
                f"{num_servers} API servers need as many input and output addresses "
                f"(got {len(input_addresses)} and {len(output_addresses)})"
            )
        self.listen_address = listen_address
        self.sock = sock
        self.args = args
        # Spawned (their own event loops), from interpreters `vllm serve`
        # pre-started for them when it knew their number.
        context = WARM_API_SERVER_CONTEXT
        self.processes: list[BaseProcess] = []
        self._death_writers: list[connection.Connection] = []
        for i, (in_addr, out_addr) in enumerate(zip(input_addresses, output_addresses)):
            reader, writer = context.Pipe(duplex=False)
            self._death_writers.append(parent_only(writer))
            client_config: dict[str, Any] = {
                "input_address": in_addr,
                "output_address": out_addr,
                "client_count": num_servers,
                "client_index": i,
                "death_pipe": reader,
            }
            if stats_update_address is not None:
                client_config["stats_update_address"] = stats_update_address
            if engine_ready_info is not None:
                client_config["engine_ready_info"] = engine_ready_info
            proc = context.Process(
                target=target_server_fn,
                name=f"ApiServer_{i}",
                args=(listen_address, sock, args, client_config),
            )
            self.processes.append(proc)
            proc.start()
            reader.close()  # the child holds its own copy
        logger.info("Started %d API server processes", len(self.processes))
        self._finalizer = weakref.finalize(self, shutdown, self.processes, self._death_writers)

    def shutdown(self, timeout: float | None = None) -> None:
        """SIGTERM every API server, wait up to `timeout` s (default 5), then
        SIGKILL what is left (idempotent)."""
        if self._finalizer.detach() is not None:
            shutdown(self.processes, self._death_writers, timeout=timeout)


class _EngineManager(Protocol):
    """What wait_for_completion_or_failure needs of an engine manager."""

    def sentinels(self) -> list[int]: ...

    def finished_procs(self) -> dict[str, int]: ...


def wait_for_completion_or_failure(
    api_server_manager: APIServerProcessManager,
    engine_manager: _EngineManager | None = None,
    coordinator_procs: Iterable[BaseProcess] = (),
    timeout: float | None = None,
) -> None:
    """Watch the API servers, the engine cores and the coordinator. An engine
    core or the coordinator exiting, or an API server exiting with a non-zero
    code (killed, crashed), raises RuntimeError naming it: the caller then
    stops everything. An API server that exits cleanly (exit code 0: it was
    told to stop) is let go; returns once none is left. KeyboardInterrupt
    (Ctrl-C) returns. `timeout`: raise TimeoutError after that many seconds.

    Deviation from upstream: the coordinator is passed as its processes
    (upstream passes the DPCoordinator object and reads `.proc`).
    """
    sentinel_to_proc: dict[Any, BaseProcess | None] = {
        proc.sentinel: proc for proc in api_server_manager.processes
    }
    for proc in coordinator_procs:
        sentinel_to_proc[proc.sentinel] = proc
    if engine_manager is not None:
        for sentinel in engine_manager.sentinels():
            sentinel_to_proc[sentinel] = None
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        logger.info("Waiting for API servers to complete ...")
        api_servers = {proc.sentinel for proc in api_server_manager.processes}
        while api_servers:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = connection.wait(list(sentinel_to_proc), timeout=remaining)
            if not ready:
                raise TimeoutError(f"no process exited within {timeout} s")
            for ready_sentinel in ready:
                assert isinstance(ready_sentinel, int)
                exited = sentinel_to_proc.pop(ready_sentinel)
                api_servers.discard(ready_sentinel)
                _check_exit(exited, engine_manager)
    except KeyboardInterrupt:
        logger.info("Received KeyboardInterrupt, shutting down API servers...")


def _check_exit(proc: BaseProcess | None, engine_manager: _EngineManager | None) -> None:
    """Raise unless `proc` (None: an engine core) exited cleanly."""
    if proc is None:
        assert engine_manager is not None
        raise RuntimeError(
            f"Engine core process(es) died unexpectedly: {engine_manager.finished_procs()}"
        )
    if proc.exitcode != 0:
        raise RuntimeError(
            f"Process {proc.name} (PID: {proc.pid}) died with exit code {proc.exitcode}"
        )


def shutdown(
    procs: list[BaseProcess],
    death_writers: Sequence[connection.Connection] = (),
    timeout: float | None = None,
) -> None:
    """SIGTERM, wait up to `timeout` s (default 5), then SIGKILL; reap all.
    (A plain function, not a method, so that a finalizer can hold it.)"""
    timeout = 5.0 if timeout is None else timeout
    procs = [proc for proc in procs if proc.pid is not None]
    for proc in procs:
        if proc.is_alive():
            logger.info("Sending SIGTERM to %s", proc.name)
            proc.terminate()
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            logger.warning("Process %s did not exit in %.0f s; killing it.", proc.name, timeout)
            proc.kill()
            proc.join(5.0)
    for writer in death_writers:
        writer.close()


__all__ = [
    "APIServerProcessManager",
    "ConstantList",
    "shutdown",
    "tensor_data",
    "wait_for_completion_or_failure",
]
