"""Launching engine-core processes and the start-up handshake
(upstream: vllm/v1/engine/utils.py; socket helpers from vllm/utils).

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
import os
import signal
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any, overload
from uuid import uuid4

import msgspec
import zmq

import vllm.envs as envs
from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.executor.abstract import Executor

logger = init_logger(__name__)

_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


# ----------------------------------------------------------------------
# Sockets
# ----------------------------------------------------------------------


def get_open_zmq_ipc_path() -> str:
    """A fresh `ipc://` path in the temp dir (one per socket)."""
    return f"ipc://{tempfile.gettempdir()}/vllm-{uuid4()}"


def get_open_zmq_inproc_path() -> str:
    return f"inproc://{uuid4()}"


def check_zmq_address(path: str) -> None:
    """Refuse any address that is not ipc, inproc or loopback TCP."""
    if path.startswith(("ipc://", "inproc://")):
        return
    if path.startswith("tcp://"):
        host = path[len("tcp://") :].rsplit(":", 1)[0]
        if host in _LOOPBACK_HOSTS:
            return
    raise ValueError(
        f"Refusing ZMQ address {path!r}: only ipc://, inproc:// and loopback "
        "tcp:// addresses are allowed"
    )


@overload
def make_zmq_socket(
    ctx: zmq.asyncio.Context,
    path: str,
    socket_type: int,
    bind: bool | None = None,
    identity: bytes | None = None,
    linger: int | None = None,
) -> zmq.asyncio.Socket: ...


@overload
def make_zmq_socket(
    ctx: zmq.SyncContext,
    path: str,
    socket_type: int,
    bind: bool | None = None,
    identity: bytes | None = None,
    linger: int | None = None,
) -> zmq.SyncSocket: ...


@overload
def make_zmq_socket(
    ctx: zmq.SyncContext | zmq.asyncio.Context,
    path: str,
    socket_type: int,
    bind: bool | None = None,
    identity: bytes | None = None,
    linger: int | None = None,
) -> zmq.Socket[Any]: ...


def make_zmq_socket(
    ctx: zmq.SyncContext | zmq.asyncio.Context,
    path: str,
    socket_type: int,
    bind: bool | None = None,
    identity: bytes | None = None,
    linger: int | None = None,
) -> zmq.Socket[Any]:
    """Make a socket, bind or connect it to `path`.

    bind defaults to True for ROUTER and PULL (the client's ends), False otherwise.
    """
    check_zmq_address(path)
    socket = ctx.socket(socket_type)
    # No high-water mark: the engine must never drop a message.
    if socket_type in (zmq.PULL, zmq.DEALER, zmq.ROUTER):
        socket.setsockopt(zmq.RCVHWM, 0)
    if socket_type in (zmq.PUSH, zmq.DEALER, zmq.ROUTER):
        socket.setsockopt(zmq.SNDHWM, 0)
    if identity is not None:
        socket.setsockopt(zmq.IDENTITY, identity)
    if linger is not None:
        socket.setsockopt(zmq.LINGER, linger)
    if bind is None:
        bind = socket_type in (zmq.ROUTER, zmq.PULL)
    if bind:
        socket.bind(path)
    else:
        socket.connect(path)
    return socket


@contextlib.contextmanager
def zmq_socket_ctx(
    path: str,
    socket_type: int,
    bind: bool | None = None,
    linger: int = 0,
    identity: bytes | None = None,
) -> Iterator[zmq.SyncSocket]:
    """A socket on its own context, closed (and the context terminated) on exit."""
    ctx = zmq.Context()
    try:
        yield make_zmq_socket(ctx, path, socket_type, bind=bind, identity=identity)
    finally:
        ctx.destroy(linger=linger)


def encode_handshake(msg: dict[str, Any]) -> bytes:
    return msgspec.msgpack.encode(msg)


def decode_handshake(data: bytes) -> dict[str, Any]:
    """Handshake messages are plain msgpack maps (never pickles)."""
    msg = msgspec.msgpack.decode(data, type=dict[str, Any])
    return msg


@dataclass
class EngineZmqAddresses:
    # ZMQ input socket addresses, one per API-server client (we have one).
    inputs: list[str]
    # ZMQ output socket addresses, one per API-server client.
    outputs: list[str]


# ----------------------------------------------------------------------
# Processes
# ----------------------------------------------------------------------


def block_shutdown_signals() -> None:
    """Call at the start of a helper thread: SIGTERM / SIGINT then go to the
    main thread, whose handler turns them into a clean shutdown."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})


def watch_parent(death_pipe: Connection) -> None:
    """In a child: SIGTERM ourselves when the parent dies (its pipe end closes),
    so that a killed front end leaves no orphan engine behind."""

    def wait() -> None:
        block_shutdown_signals()
        with contextlib.suppress(EOFError, OSError):
            death_pipe.recv()
        logger.info("Parent process exited; shutting down.")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait, daemon=True, name="ParentDeathWatcher").start()


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
    from vllm.v1.engine.core_proc import EngineCoreProc

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
