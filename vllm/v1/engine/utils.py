"""Launching engine-core processes and the start-up handshake
(upstream: vllm/v1/engine/utils.py). The sockets, the handshake messages
and the signal helpers both processes use are in ipc.py.

Start-up, as upstream:

    client                                      engine core process
    ------                                      -------------------
    bind ROUTER on a handshake ipc path
    spawn EngineCoreProc.run_engine_core  -->   connect DEALER to it
                                          <--   HELLO
    reply with the input/output addresses -->
                                                build EngineCore (load the model,
                                                size the KV cache)
                                          <--   READY {num_gpu_blocks, max_model_len}
                                                (or FAILED {error} and exit)
    bind ROUTER (inputs) and PULL (outputs)     connect DEALER (inputs) and PUSH
                                          <--   an empty first message, so that
                                                the ROUTER learns its identity

Every socket is on `ipc://` (a fresh path in the temp dir) or on the loopback
interface: nothing is ever bound to all interfaces.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

import zmq

import vllm.envs as envs
from vllm.logger import init_logger
from vllm.v1.engine.core_proc import EngineCoreProc

# Upstream's names of this module, defined with the sockets and the handshake
# messages in ipc.py (which EngineCoreProc imports instead of this launcher).
from vllm.v1.engine.ipc import (
    EngineZmqAddresses,
    block_shutdown_signals,
    check_zmq_address,
    decode_handshake,
    encode_handshake,
    get_open_zmq_inproc_path,
    get_open_zmq_ipc_path,
    make_zmq_socket,
    watch_parent,
    zmq_socket_ctx,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.executor.abstract import Executor

__all__ = [
    "CoreEngineProcManager",
    "EngineZmqAddresses",
    "block_shutdown_signals",
    "check_zmq_address",
    "decode_handshake",
    "encode_handshake",
    "get_open_zmq_inproc_path",
    "get_open_zmq_ipc_path",
    "launch_core_engines",
    "make_zmq_socket",
    "shutdown_processes",
    "wait_for_engine_startup",
    "watch_parent",
    "zmq_socket_ctx",
]

logger = init_logger(__name__)


class CoreEngineProcManager:
    """Starts the engine-core processes of this client and stops them.

    `close()` (also run by a weakref finalizer and at interpreter exit)
    sends SIGTERM, waits, then SIGKILLs whatever is left.
    """

    def __init__(
        self,
        target_fn: Callable[..., None],
        local_engine_count: int,
        vllm_config: VllmConfig,
        local_client: bool,
        handshake_address: str,
        executor_class: type[Executor],
        log_stats: bool,
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self.processes: list[BaseProcess] = []
        # The child only reads; when this process dies the pipe closes.
        self._death_writers: list[Connection] = []
        for index in range(local_engine_count):
            reader, writer = context.Pipe(duplex=False)
            self._death_writers.append(writer)
            self.processes.append(
                context.Process(
                    target=target_fn,
                    name=f"EngineCore_DP{index}",
                    kwargs=dict(
                        vllm_config=vllm_config,
                        local_client=local_client,
                        handshake_address=handshake_address,
                        executor_class=executor_class,
                        log_stats=log_stats,
                        dp_rank=index,
                        death_pipe=reader,
                    ),
                )
            )
        self._finalizer = weakref.finalize(
            self, shutdown_processes, self.processes, self._death_writers
        )
        # multiprocessing's own exit hook joins non-daemon children; this one,
        # registered later, runs before it and stops them first.
        atexit.register(self._finalizer)
        for proc in self.processes:
            proc.start()

    def close(self) -> None:
        """Stop every engine process (idempotent)."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        """Whether close() ran (or is running): exits after it are expected."""
        return not self._finalizer.alive

    def sentinels(self) -> list[int]:
        return [proc.sentinel for proc in self.processes]

    def finished_procs(self) -> dict[str, int]:
        """Name -> exit code of each engine process that has exited."""
        return {proc.name: proc.exitcode for proc in self.processes if proc.exitcode is not None}


def shutdown_processes(
    procs: list[BaseProcess],
    death_writers: Sequence[Connection] = (),
    timeout: float = 5.0,
) -> None:
    """SIGTERM, wait up to `timeout` s, then SIGKILL; reap every process."""
    procs = [proc for proc in procs if proc.pid is not None]  # skip any that never started
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            logger.warning(
                "Engine process %s did not exit in %.0fs; killing it.", proc.name, timeout
            )
            proc.kill()
            proc.join(2.0)
    for writer in death_writers:
        writer.close()


@contextlib.contextmanager
def launch_core_engines(
    vllm_config: VllmConfig,
    executor_class: type[Executor],
    log_stats: bool,
) -> Iterator[tuple[CoreEngineProcManager, EngineZmqAddresses]]:
    """Spawn the engine core and complete its handshake.

    Yields (process manager, addresses) once the processes are started, so the
    caller can keep the manager even if start-up fails; the handshake (up to
    READY) runs when the `with` block exits and raises on failure.
    """
    addresses = EngineZmqAddresses(
        inputs=[get_open_zmq_ipc_path()], outputs=[get_open_zmq_ipc_path()]
    )
    handshake_address = get_open_zmq_ipc_path()
    with zmq_socket_ctx(handshake_address, zmq.ROUTER, bind=True) as handshake_socket:
        manager = CoreEngineProcManager(
            EngineCoreProc.run_engine_core,
            local_engine_count=1,
            vllm_config=vllm_config,
            local_client=True,
            handshake_address=handshake_address,
            executor_class=executor_class,
            log_stats=log_stats,
        )
        yield manager, addresses
        wait_for_engine_startup(handshake_socket, addresses, manager, vllm_config)


def wait_for_engine_startup(
    handshake_socket: zmq.SyncSocket,
    addresses: EngineZmqAddresses,
    proc_manager: CoreEngineProcManager,
    vllm_config: VllmConfig,
) -> None:
    """Answer HELLO with the addresses and wait for READY from every engine.

    Raises RuntimeError if an engine reports FAILED or exits, TimeoutError
    after VLLM_ENGINE_READY_TIMEOUT_S.
    """
    pending = {i.to_bytes(2, "little") for i in range(len(proc_manager.processes))}
    poller = zmq.Poller()
    poller.register(handshake_socket, zmq.POLLIN)
    for sentinel in proc_manager.sentinels():
        poller.register(sentinel, zmq.POLLIN)
    deadline = time.monotonic() + envs.VLLM_ENGINE_READY_TIMEOUT_S
    while pending:
        remaining_ms = (deadline - time.monotonic()) * 1000
        if remaining_ms <= 0:
            raise TimeoutError(
                "Timed out waiting for the engine core to start "
                f"(VLLM_ENGINE_READY_TIMEOUT_S={envs.VLLM_ENGINE_READY_TIMEOUT_S})"
            )
        events = dict(poller.poll(min(remaining_ms, 5000)))
        if handshake_socket in events:
            identity, data = handshake_socket.recv_multipart()
            _handle_handshake_message(
                handshake_socket, identity, decode_handshake(data), addresses, pending, vllm_config
            )
            continue
        finished = proc_manager.finished_procs()
        if finished:
            raise RuntimeError(
                "Engine core initialization failed. See root cause above. "
                f"Failed core proc(s): {finished}"
            )


def _handle_handshake_message(
    socket: zmq.SyncSocket,
    identity: bytes,
    msg: dict[str, Any],
    addresses: EngineZmqAddresses,
    pending: set[bytes],
    vllm_config: VllmConfig,
) -> None:
    status = msg.get("status")
    if identity not in pending:
        raise RuntimeError(f"Unexpected handshake message from engine {identity!r}")
    if status == "HELLO":
        reply = {"addresses": {"inputs": addresses.inputs, "outputs": addresses.outputs}}
        socket.send_multipart((identity, encode_handshake(reply)))
    elif status == "READY":
        # What the engine decided at start-up becomes the front end's view.
        num_gpu_blocks = int(msg["num_gpu_blocks"])
        max_model_len = int(msg["max_model_len"])
        vllm_config.cache_config.num_gpu_blocks = num_gpu_blocks
        assert vllm_config.model_config is not None  # the engine core started a model
        vllm_config.model_config.max_model_len = max_model_len
        vllm_config.scheduler_config.max_model_len = max_model_len
        pending.discard(identity)
        logger.info(
            "Engine core %d ready: %d KV-cache blocks, max_model_len %d",
            int.from_bytes(identity, "little"),
            num_gpu_blocks,
            max_model_len,
        )
    elif status == "FAILED":
        raise RuntimeError(f"Engine core initialization failed: {msg.get('error')}")
    else:
        raise RuntimeError(f"Unexpected handshake status {status!r}")
