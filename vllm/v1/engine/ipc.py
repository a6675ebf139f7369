"""How the front end and the engine-core processes reach each other: ZMQ
sockets (on `ipc://` paths, loopback tcp - all of 127.0.0.0/8 - or tcp on the
data-parallel address the user gave with --data-parallel-address, never a
wildcard such as 0.0.0.0 / :: / *), the start-up handshake's
messages and addresses, and the signal helpers of their threads
(upstream: vllm/v1/engine/utils.py and vllm/utils/network_utils.py).

A leaf of the engine package: both sides use it (EngineCoreProc in the core
process, the MP clients and the launcher in utils.py in the front end), so
it imports neither, and the launcher can import EngineCoreProc plainly.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, NoReturn, overload
from uuid import uuid4

import msgspec
import zmq

from vllm.logger import init_logger
from vllm.utils.system_utils import exit_skipping_teardown

if TYPE_CHECKING:
    import zmq.asyncio

logger = init_logger(__name__)

_WILDCARD_HOSTS = ("*", "0.0.0.0", "::", "")
# Hosts allowed besides loopback (allow_zmq_host).
_ALLOWED_HOSTS: set[str] = set()


# ----------------------------------------------------------------------
# Sockets
# ----------------------------------------------------------------------


def get_open_zmq_ipc_path() -> str:
    """A fresh `ipc://` path in the temp dir (one per socket)."""
    return f"ipc://{tempfile.gettempdir()}/vllm-{uuid4()}"


def get_open_zmq_inproc_path() -> str:
    return f"inproc://{uuid4()}"


def allow_zmq_host(host: str) -> None:
    """Allow tcp:// sockets on `host` in this process: the DP head node's
    address the user gave (-dpa / --data-parallel-address), which remote
    engines reach. A wildcard (every interface) is never allowed."""
    if host.strip("[]") in _WILDCARD_HOSTS:
        raise ValueError(
            f"Refusing data_parallel_master_ip={host!r} (--data-parallel-address): it "
            "names every interface; give the address of this node."
        )
    _ALLOWED_HOSTS.add(host)


def _is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and localhost (several Ray "nodes" on one machine use
    127.0.0.2, 127.0.0.3, ...)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_zmq_address(path: str) -> None:
    """Refuse any address that is not ipc, inproc, loopback TCP or TCP on a
    host allowed with `allow_zmq_host` (never a wildcard)."""
    if path.startswith(("ipc://", "inproc://")):
        return
    if path.startswith("tcp://"):
        host = path[len("tcp://") :].rsplit(":", 1)[0]
        if host.strip("[]") not in _WILDCARD_HOSTS and (
            _is_loopback(host) or host in _ALLOWED_HOSTS
        ):
            return
    raise ValueError(
        f"Refusing ZMQ address {path!r}: only ipc://, inproc://, loopback tcp:// "
        "and the data-parallel address (--data-parallel-address) are allowed"
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
    if socket_type == zmq.XPUB:
        # Pass every subscription up, not only the first of a topic: the DP
        # coordinator counts one per engine.
        socket.setsockopt(zmq.XPUB_VERBOSE, True)
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


def get_engine_client_zmq_addr(local_only: bool, host: str, port: int = 0) -> str:
    """A fresh ipc path when every peer is on this node, else `tcp://host:port`
    (port 0: the binder picks one, read back with zmq.LAST_ENDPOINT)."""
    if local_only:
        return get_open_zmq_ipc_path()
    return f"tcp://{host}:{port}"


@dataclass
class EngineZmqAddresses:
    # ZMQ input socket addresses, one per API-server client.
    inputs: list[str]
    # ZMQ output socket addresses, one per API-server client.
    outputs: list[str]
    # The DP coordinator's engine-facing sockets (DP > 1): engines subscribe
    # to its XPUB (START_DP_WAVE) and PUSH their stats to its PULL.
    coordinator_input: str | None = None
    coordinator_output: str | None = None
    # The coordinator's XPUB that front ends subscribe to for the engines'
    # queue stats (relayed in the handshake; engines do not use it).
    frontend_stats_publish_address: str | None = None

    def to_handshake(self) -> dict[str, Any]:
        """The addresses as a plain msgpack-able map (handshake reply)."""
        return {
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "coordinator_input": self.coordinator_input,
            "coordinator_output": self.coordinator_output,
            "frontend_stats_publish_address": self.frontend_stats_publish_address,
        }

    @classmethod
    def from_handshake(cls, msg: dict[str, Any]) -> EngineZmqAddresses:
        return cls(
            inputs=list(msg["inputs"]),
            outputs=list(msg["outputs"]),
            coordinator_input=msg.get("coordinator_input"),
            coordinator_output=msg.get("coordinator_output"),
            frontend_stats_publish_address=msg.get("frontend_stats_publish_address"),
        )


# ----------------------------------------------------------------------
# Processes
# ----------------------------------------------------------------------


def exit_process(code: int) -> NoReturn:
    """Leave a child process (engine core, DP coordinator) once everything is
    shut down, without the interpreter's teardown (a full GC over the torch
    heap, > 5 s on a loaded machine, past the parent's SIGTERM grace;
    nanobind's leak report) nor the atexit hooks: the parent owns the rest."""
    exit_skipping_teardown(code, run_exit_hooks=False)


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
