"""Launching engine-core processes (and the DP coordinator) and the start-up
handshake (upstream: vllm/v1/engine/utils.py). The sockets, the handshake
messages and the signal helpers both processes use are in ipc.py.

Start-up, as upstream:

    front end (DP rank 0's)                     engine core process (each DP rank)
    -----------------------                     ----------------------------------
    bind ROUTER (inputs) and PULL (outputs)
    DP > 1: start the DPCoordinator process
    bind ROUTER on the handshake address
    (ipc; tcp on -dpa:-dpp when some ranks
    are remote, --headless nodes)
    spawn EngineCoreProc.run_engine_core  -->   connect DEALER to it
                                          <--   HELLO {local, headless, dp size}
    reply: the addresses (inputs, outputs,-->
    coordinator's) and the DP ports             build EngineCore (load the model,
                                                size the KV cache)
                                          <--   READY {num_gpu_blocks, max_model_len}
                                                (or FAILED {error} and exit)
                                                connect DEALER (inputs), PUSH
                                                (outputs), and the coordinator's
                                                XSUB / PUSH; wait for its READY
                                          <--   an empty first message, so that
                                                the ROUTER learns its identity
                                                (dp_rank as 2 bytes, little-endian)

A remote engine with another --data-parallel-size is refused at its HELLO;
remote engines that never connect end in a TimeoutError. Every socket is on
`ipc://`, loopback, or the -dpa address: nothing is bound to all interfaces.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

import zmq

import vllm.envs as envs
from vllm.logger import init_logger
from vllm.utils.system_utils import get_mp_context, parent_only
from vllm.v1.engine.coordinator import DPCoordinator
from vllm.v1.engine.core_proc import EngineCoreProc

# Upstream's names of this module, defined with the sockets and the handshake
# messages in ipc.py (which EngineCoreProc imports instead of this launcher).
from vllm.v1.engine.ipc import (
    EngineZmqAddresses,
    allow_zmq_host,
    block_shutdown_signals,
    check_zmq_address,
    decode_handshake,
    encode_handshake,
    get_engine_client_zmq_addr,
    get_open_zmq_inproc_path,
    get_open_zmq_ipc_path,
    make_zmq_socket,
    watch_parent,
    zmq_socket_ctx,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.engine.ray_dp import CoreEngineActorManager
    from vllm.v1.executor.abstract import Executor

__all__ = [
    "CoreEngine",
    "CoreEngineLaunch",
    "CoreEngineProcManager",
    "EngineZmqAddresses",
    "block_shutdown_signals",
    "check_zmq_address",
    "decode_handshake",
    "encode_handshake",
    "get_engine_client_zmq_addr",
    "get_engine_zmq_addresses",
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
    """Starts this node's engine-core processes (DP ranks `start_index` ..
    `start_index + local_engine_count - 1`) and stops them.

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
        start_index: int = 0,
        local_start_index: int = 0,
    ) -> None:
        context = get_mp_context()
        is_dp = vllm_config.parallel_config.data_parallel_size > 1
        self.processes: list[BaseProcess] = []
        # The child only reads; when this process dies the pipe closes.
        self._death_writers: list[Connection] = []
        for index in range(local_engine_count):
            reader, writer = context.Pipe(duplex=False)
            self._death_writers.append(parent_only(writer))
            global_index = start_index + index
            self.processes.append(
                context.Process(
                    target=target_fn,
                    name=f"EngineCore_DP{global_index}" if is_dp else "EngineCore",
                    kwargs=dict(
                        vllm_config=vllm_config,
                        local_client=local_client,
                        handshake_address=handshake_address,
                        executor_class=executor_class,
                        log_stats=log_stats,
                        dp_rank=global_index,
                        local_dp_rank=local_start_index + index,
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
        with _engine_threads_env(vllm_config, local_engine_count):
            for proc in self.processes:
                proc.start()

    def close(self) -> None:
        """Stop every engine process (idempotent)."""
        self._finalizer()

    def shutdown(self, timeout: float | None = None) -> None:
        """Upstream's name of close()."""
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


@contextlib.contextmanager
def _engine_threads_env(vllm_config: VllmConfig, local_engine_count: int) -> Iterator[None]:
    """With several engines on this node, each gets its share of the cores
    (OMP_NUM_THREADS for the children, unless the user set it; upstream
    binds each DP rank's CPU workers to its own cores the same way)."""
    old = os.environ.get("OMP_NUM_THREADS")
    if old is not None or local_engine_count <= 1:
        yield
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = local_engine_count * vllm_config.parallel_config.world_size
    os.environ["OMP_NUM_THREADS"] = str(max(1, (cores or 1) // workers))
    try:
        yield
    finally:
        os.environ.pop("OMP_NUM_THREADS", None)


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


@dataclass
class CoreEngine:
    """One DP rank, tracked through the start-up handshake."""

    index: int
    local: bool
    state: str = "NEW"  # -> CONNECTED (HELLO answered) -> READY

    @property
    def identity(self) -> bytes:
        return self.index.to_bytes(2, "little")


@dataclass
class CoreEngineLaunch:
    """What launch_core_engines started (upstream's name)."""

    engine_manager: CoreEngineProcManager | CoreEngineActorManager | None
    coordinator: DPCoordinator | None
    addresses: EngineZmqAddresses


def get_engine_zmq_addresses(
    vllm_config: VllmConfig, num_api_servers: int = 1
) -> EngineZmqAddresses:
    """The front ends' input / output addresses: ipc paths when every engine
    is on this node, else tcp on data_parallel_master_ip (port chosen at bind)."""
    parallel_config = vllm_config.parallel_config
    local_only = parallel_config.data_parallel_size_local == parallel_config.data_parallel_size
    host = parallel_config.data_parallel_master_ip

    def addr() -> str:
        return get_engine_client_zmq_addr(local_only, host)

    return EngineZmqAddresses(
        inputs=[addr() for _ in range(num_api_servers)],
        outputs=[addr() for _ in range(num_api_servers)],
    )


@contextlib.contextmanager
def launch_core_engines(
    vllm_config: VllmConfig,
    executor_class: type[Executor],
    log_stats: bool,
    addresses: EngineZmqAddresses | None = None,
) -> Iterator[CoreEngineLaunch]:
    """Start the DP coordinator (DP > 1) and this node's engine cores, and
    complete the handshake with every engine (the local ones and, on the
    head node, remote headless ones over tcp).

    Yields once the processes are started, so the caller can keep the
    managers even if start-up fails; the handshake (up to every READY) runs
    when the `with` block exits and raises on failure. `addresses` are the
    front ends' sockets (one pair per API server; default: one ipc pair).
    """
    parallel_config = vllm_config.parallel_config
    dp_size = parallel_config.data_parallel_size
    local_engine_count = parallel_config.data_parallel_size_local
    dp_rank = parallel_config.data_parallel_rank
    allow_zmq_host(parallel_config.data_parallel_master_ip)
    if addresses is None:
        addresses = get_engine_zmq_addresses(vllm_config)
    coordinator = _start_coordinator(vllm_config, addresses) if dp_size > 1 else None
    launch = CoreEngineLaunch(None, coordinator, addresses)
    if parallel_config.data_parallel_backend == "ray":
        # Engine cores as Ray actors on placement groups (ray_dp.py): ready
        # when the constructor returns; they get the addresses, no handshake.
        from vllm.v1.engine.ray_dp import CoreEngineActorManager

        try:
            launch.engine_manager = CoreEngineActorManager(
                vllm_config, addresses, executor_class, log_stats
            )
        except BaseException:
            if coordinator is not None:
                coordinator.close()
            raise
        yield launch
        return
    # Rank 0 handshakes with every engine, local (ipc) and remote (tcp).
    engines = [CoreEngine(index=i, local=i < local_engine_count) for i in range(dp_size)]
    handshake_address = get_engine_client_zmq_addr(
        local_engine_count == dp_size,
        parallel_config.data_parallel_master_ip,
        parallel_config.data_parallel_rpc_port,
    )
    try:
        with zmq_socket_ctx(handshake_address, zmq.ROUTER, bind=True) as handshake_socket:
            if local_engine_count:
                launch.engine_manager = CoreEngineProcManager(
                    EngineCoreProc.run_engine_core,
                    local_engine_count=local_engine_count,
                    vllm_config=vllm_config,
                    local_client=True,
                    handshake_address=handshake_address,
                    executor_class=executor_class,
                    log_stats=log_stats,
                    start_index=dp_rank,
                )
            yield launch
            wait_for_engine_startup(handshake_socket, engines, launch, vllm_config)
    except BaseException:
        # The caller may not have the launch yet (an error before the yield).
        if coordinator is not None and launch.engine_manager is None:
            coordinator.close()
        raise


def _start_coordinator(vllm_config: VllmConfig, addresses: EngineZmqAddresses) -> DPCoordinator:
    """The DP coordinator (its waves only for MoE models, as upstream)."""
    assert vllm_config.model_config is not None
    coordinator = DPCoordinator(
        vllm_config.parallel_config, enable_wave_coordination=vllm_config.model_config.is_moe
    )
    addresses.coordinator_input, addresses.coordinator_output = (
        coordinator.get_engine_socket_addresses()
    )
    addresses.frontend_stats_publish_address = coordinator.get_stats_publish_address()
    logger.info("Started DP Coordinator process (PID: %d)", coordinator.proc.pid)
    return coordinator


def wait_for_engine_startup(
    handshake_socket: zmq.SyncSocket,
    core_engines: list[CoreEngine],
    launch: CoreEngineLaunch,
    vllm_config: VllmConfig,
) -> None:
    """Answer each engine's HELLO with the addresses and wait for every READY.

    Raises RuntimeError if an engine reports FAILED or a local engine (or
    the coordinator) exits, TimeoutError after VLLM_ENGINE_READY_TIMEOUT_S
    (remote engines that never connect end here too).
    """
    poller = zmq.Poller()
    poller.register(handshake_socket, zmq.POLLIN)
    manager = launch.engine_manager
    watched = list(manager.sentinels()) if manager is not None else []
    if launch.coordinator is not None:
        watched.append(launch.coordinator.proc.sentinel)
    for sentinel in watched:
        poller.register(sentinel, zmq.POLLIN)
    deadline = time.monotonic() + envs.VLLM_ENGINE_READY_TIMEOUT_S
    while any(engine.state != "READY" for engine in core_engines):
        remaining_ms = (deadline - time.monotonic()) * 1000
        if remaining_ms <= 0:
            pending = [e.index for e in core_engines if e.state != "READY"]
            raise TimeoutError(
                f"Timed out waiting for engine core(s) {pending} to start "
                f"(VLLM_ENGINE_READY_TIMEOUT_S={envs.VLLM_ENGINE_READY_TIMEOUT_S}); "
                "remote engines join from --headless nodes."
            )
        events = dict(poller.poll(min(remaining_ms, 5000)))
        if handshake_socket in events:
            identity, data = handshake_socket.recv_multipart()
            _handle_handshake_message(
                handshake_socket,
                identity,
                decode_handshake(data),
                core_engines,
                launch,
                vllm_config,
            )
            continue
        _check_startup_procs(launch)


def _check_startup_procs(launch: CoreEngineLaunch) -> None:
    finished = launch.engine_manager.finished_procs() if launch.engine_manager else {}
    coordinator = launch.coordinator
    if coordinator is not None and coordinator.proc.exitcode is not None:
        finished[coordinator.proc.name or "DPCoordinator"] = coordinator.proc.exitcode
    if finished:
        raise RuntimeError(
            "Engine core initialization failed. See root cause above. "
            f"Failed core proc(s): {finished}"
        )


def _handle_handshake_message(
    socket: zmq.SyncSocket,
    identity: bytes,
    msg: dict[str, Any],
    core_engines: list[CoreEngine],
    launch: CoreEngineLaunch,
    vllm_config: VllmConfig,
) -> None:
    status = msg.get("status")
    eng_index = int.from_bytes(identity, "little")
    engine = next((e for e in core_engines if e.identity == identity), None)
    if engine is None:
        raise RuntimeError(f"Message from engine with unexpected data parallel rank: {eng_index}")
    if status == "FAILED":
        raise RuntimeError(
            f"Engine core initialization failed (engine {eng_index}): {msg.get('error')}"
        )
    local = bool(msg.get("local"))
    if local != engine.local:
        raise RuntimeError(
            f"{status} message from {'local' if local else 'remote'} engine {eng_index}, "
            f"expected it to be {'local' if engine.local else 'remote'}"
        )
    if status == "HELLO" and engine.state == "NEW":
        _check_remote_config(msg, eng_index, vllm_config)
        reply = {
            "addresses": launch.addresses.to_handshake(),
            "parallel_config": _shared_parallel_config(vllm_config),
        }
        socket.send_multipart((identity, encode_handshake(reply)))
        engine.state = "CONNECTED"
    elif status == "READY" and engine.state == "CONNECTED":
        _apply_ready(msg, eng_index, vllm_config)
        engine.state = "READY"
    else:
        raise RuntimeError(
            f"Unexpected {status} message for engine {eng_index} in {engine.state} state."
        )


def _check_remote_config(msg: dict[str, Any], eng_index: int, vllm_config: VllmConfig) -> None:
    """A remote node started with other DP sizes would hang the DP group:
    refuse it at start-up (its HELLO carries its view)."""
    dp_size = msg.get("data_parallel_size")
    expected = vllm_config.parallel_config.data_parallel_size
    if dp_size is not None and dp_size != expected:
        raise RuntimeError(
            f"Engine {eng_index} was started with data_parallel_size={dp_size} "
            f"(--data-parallel-size), but this node runs data_parallel_size={expected}: "
            "start every node with the same --data-parallel-size."
        )


def _shared_parallel_config(vllm_config: VllmConfig) -> dict[str, Any]:
    """The DP settings every engine must share (ports chosen by this front end)."""
    pc = vllm_config.parallel_config
    return {
        "data_parallel_master_ip": pc.data_parallel_master_ip,
        "data_parallel_master_port": pc.data_parallel_master_port,
        "_data_parallel_master_port_list": list(pc._data_parallel_master_port_list),
        "data_parallel_size": pc.data_parallel_size,
    }


def _apply_ready(msg: dict[str, Any], eng_index: int, vllm_config: VllmConfig) -> None:
    """What the engine decided at start-up becomes the front end's view (the
    smallest over the engines, which share one config)."""
    num_gpu_blocks = int(msg["num_gpu_blocks"])
    max_model_len = int(msg["max_model_len"])
    cache_config = vllm_config.cache_config
    if cache_config.num_gpu_blocks:
        num_gpu_blocks = min(num_gpu_blocks, cache_config.num_gpu_blocks)
    cache_config.num_gpu_blocks = num_gpu_blocks
    assert vllm_config.model_config is not None  # the engine core started a model
    vllm_config.model_config.max_model_len = max_model_len
    vllm_config.scheduler_config.max_model_len = max_model_len
    logger.info(
        "Engine core %d ready: %d KV-cache blocks, max_model_len %d",
        eng_index,
        int(msg["num_gpu_blocks"]),
        max_model_len,
    )
