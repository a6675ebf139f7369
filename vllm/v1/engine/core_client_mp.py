"""The multiprocess engine-core clients (upstream: `MPClient`, `SyncMPClient`,
`AsyncMPClient` in vllm/v1/engine/core_client.py, which re-exports them from here).

    MPClient.__init__: launch_core_engines() (spawn + handshake up to READY)
                       -> bind ROUTER (inputs) / PULL (outputs)
                       -> wait for the core's first message on the ROUTER
                       -> start the process monitor

Sending: `(engine identity, type byte, *msgpack frames)` on the ROUTER.
Receiving: a background thread (sync) or asyncio task (async) decodes each
`EngineCoreOutputs`; utility results resolve the caller's future, the rest
go to `outputs_queue`. The core's ENGINE_CORE_DEAD message, or the monitor
seeing the process exit, marks the engine dead: every waiter gets
`EngineDeadError`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import multiprocessing.connection
import queue
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import zmq
import zmq.asyncio

import vllm.envs as envs
from vllm.config import VllmConfig
from vllm.exceptions import LoRAAdapterNotFoundError, VLLMNotFoundError
from vllm.logger import init_logger
from vllm.lora.request import LoRARequest
from vllm.v1.engine import (
    UTILITY_ERROR_KINDS,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineCoreRequestType,
    UtilityOutput,
)
from vllm.v1.engine.core_client_base import EngineCoreClient
from vllm.v1.engine.core_proc import EngineCoreProc
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.engine.ipc import (
    allow_zmq_host,
    block_shutdown_signals,
    get_open_zmq_inproc_path,
    make_zmq_socket,
)
from vllm.v1.engine.utils import (
    CoreEngineProcManager,
    get_engine_zmq_addresses,
    launch_core_engines,
)
from vllm.v1.metrics.stats import PrefixCacheStats, SchedulerStats
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

if TYPE_CHECKING:
    from vllm.v1.engine.coordinator import DPCoordinator
    from vllm.v1.engine.ray_dp import CoreEngineActorManager
    from vllm.v1.executor.abstract import Executor

logger = init_logger(__name__)

# A utility call's pending result: asyncio's (AsyncMPClient) or a thread's (SyncMPClient).
AnyFuture = asyncio.Future[Any] | concurrent.futures.Future[Any]


@dataclass
class BackgroundResources:
    """What an MP client must release, kept apart from the client so that a
    weakref finalizer (GC or interpreter exit) can release it."""

    ctx: zmq.SyncContext
    engine_manager: CoreEngineProcManager | CoreEngineActorManager | None = None
    coordinator: DPCoordinator | None = None
    # Made on the client's context: zmq.asyncio sockets for AsyncMPClient.
    input_socket: zmq.Socket[Any] | None = None
    output_socket: zmq.Socket[Any] | None = None
    output_queue_task: asyncio.Task[None] | None = None
    shutdown_path: str | None = None
    # Callbacks run (once) when the engine is found dead.
    on_engine_dead: list[Callable[[], None]] = field(default_factory=list)
    engine_dead: bool = False

    # DP clients: the coordinator stats task and its first-request socket.
    stats_update_task: asyncio.Task[None] | None = None
    first_req_send_socket: zmq.Socket[Any] | None = None
    closing: bool = False

    def __call__(self) -> None:
        """Release everything (runs once, from shutdown() or the finalizer)."""
        self.closing = True
        self.engine_dead = True
        if self.engine_manager is not None:
            self.engine_manager.close()
        if self.coordinator is not None:
            self.coordinator.close()
        for stats_task in (self.stats_update_task,):
            if stats_task is not None and not stats_task.done():
                _cancel_task(stats_task)
        if self.first_req_send_socket is not None:
            self.first_req_send_socket.close(linger=0)
        task = self.output_queue_task
        if task is not None and not task.done():
            _cancel_task(task)
        if self.shutdown_path is not None:
            # Sync client: its output thread owns the output socket; wake it
            # so that it closes it and exits.
            with self.ctx.socket(zmq.PAIR) as shutdown_sender:
                shutdown_sender.setsockopt(zmq.LINGER, 0)
                shutdown_sender.connect(self.shutdown_path)
                with contextlib.suppress(zmq.ZMQError):  # the thread has already gone
                    shutdown_sender.send(b"", flags=zmq.NOBLOCK)
        elif self.output_socket is not None:
            self.output_socket.close(linger=0)
        if self.input_socket is not None:
            self.input_socket.close(linger=0)

    def mark_dead(self) -> None:
        """Record the engine's death and notify the client (idempotent)."""
        if self.engine_dead:
            return
        self.engine_dead = True
        for callback in self.on_engine_dead:
            callback()

    def validate_alive(self, frames: list[Any]) -> None:
        if len(frames) == 1 and bytes(frames[0].buffer) == EngineCoreProc.ENGINE_CORE_DEAD:
            self.mark_dead()
            raise EngineDeadError()


def _process_utility_output(output: UtilityOutput, utility_results: dict[int, AnyFuture]) -> None:
    """Resolve the future of a utility call with its result or failure."""
    future = utility_results.pop(output.call_id, None)
    if future is None or future.done():
        return
    if output.failure_message is not None:
        # The kind of error the core raised (ValueError, VLLMNotFoundError, ...).
        error_cls = dict(UTILITY_ERROR_KINDS).get(output.failure_kind or "", Exception)
        future.set_exception(error_cls(output.failure_message))
    else:
        future.set_result(output.result)


def _restore_stats(outputs: EngineCoreOutputs) -> None:
    """`scheduler_stats` crosses the wire untyped: rebuild the dataclass."""
    stats = outputs.scheduler_stats
    if isinstance(stats, dict):
        prefix = stats.pop("prefix_cache_stats", None) or {}
        known = SchedulerStats.__dataclass_fields__
        outputs.scheduler_stats = SchedulerStats(
            **{k: v for k, v in stats.items() if k in known},
            prefix_cache_stats=PrefixCacheStats(**prefix),
        )


class MPClient(EngineCoreClient):
    """Base of the clients whose engine core runs in a separate process."""

    def __init__(
        self,
        asyncio_mode: bool,
        vllm_config: VllmConfig,
        executor_class: type[Executor],
        log_stats: bool,
        client_addresses: dict[str, Any] | None = None,
        client_count: int = 1,
        client_index: int = 0,
    ) -> None:
        self.vllm_config = vllm_config
        self.encoder = MsgpackEncoder()
        self.decoder = MsgpackDecoder(EngineCoreOutputs)
        sync_ctx: zmq.SyncContext = zmq.Context(io_threads=2)
        self.ctx: zmq.SyncContext | zmq.asyncio.Context = (
            zmq.asyncio.Context(sync_ctx) if asyncio_mode else sync_ctx
        )
        self.resources = BackgroundResources(ctx=sync_ctx)
        self._finalizer = weakref.finalize(self, self.resources)
        self.utility_results: dict[int, AnyFuture] = {}
        self.client_count = client_count
        self.client_index = client_index
        # DP: whether the engines are in a running wave (MoE), from the coordinator.
        self.engines_running = False
        self.stats_update_address: str | None = None
        success = False
        try:
            # Sockets on the DP head node's address (remote engines) are allowed.
            allow_zmq_host(vllm_config.parallel_config.data_parallel_master_ip)
            if client_addresses:
                # Engines started by the parent (--api-server-count N): bind
                # this server's own pair of sockets.
                self._bind_sockets(
                    client_addresses["input_address"], client_addresses["output_address"]
                )
                self.stats_update_address = client_addresses.get("stats_update_address")
            else:
                self._launch_engines(vllm_config, executor_class, log_stats)
            self._set_engines_managed(vllm_config)
            self._wait_for_engine_registration()
            self._start_engine_core_monitor()
            success = True
        finally:
            if not success:
                self._finalizer()

    def _bind_sockets(self, input_address: str, output_address: str) -> tuple[str, str]:
        """Bind the ROUTER (inputs) and PULL (outputs); return the bound
        endpoints (a tcp port 0 is resolved)."""
        self.input_socket: zmq.Socket[Any] = make_zmq_socket(
            self.ctx, input_address, zmq.ROUTER, bind=True
        )
        self.resources.input_socket = self.input_socket
        output_socket = make_zmq_socket(self.ctx, output_address, zmq.PULL, bind=True)
        self.resources.output_socket = output_socket
        return (
            self.input_socket.getsockopt_string(zmq.LAST_ENDPOINT),
            output_socket.getsockopt_string(zmq.LAST_ENDPOINT),
        )

    def _launch_engines(
        self, vllm_config: VllmConfig, executor_class: type[Executor], log_stats: bool
    ) -> None:
        """Bind first (engines connect to the bound endpoints), then start the
        engines and the DP coordinator and complete their handshake."""
        addresses = get_engine_zmq_addresses(vllm_config)
        addresses.inputs[0], addresses.outputs[0] = self._bind_sockets(
            addresses.inputs[0], addresses.outputs[0]
        )
        with launch_core_engines(vllm_config, executor_class, log_stats, addresses) as launch:
            self.resources.engine_manager = launch.engine_manager
            self.resources.coordinator = launch.coordinator
        self.stats_update_address = addresses.frontend_stats_publish_address

    def _set_engines_managed(self, vllm_config: VllmConfig) -> None:
        """The DP ranks this client sends to (all of them with internal load
        balancing), as ZMQ identities."""
        parallel_config = vllm_config.parallel_config
        dp_rank = parallel_config.data_parallel_rank
        num_ranks = (
            parallel_config.data_parallel_size_local
            if parallel_config.local_engines_only
            else parallel_config.data_parallel_size
        )
        self.engine_ranks_managed = list(range(dp_rank, dp_rank + num_ranks))
        self.core_engines: list[bytes] = [
            r.to_bytes(2, "little") for r in self.engine_ranks_managed
        ]
        self.core_engine = self.core_engines[0]

    def _wait_for_engine_registration(self) -> None:
        """Each core's first (empty) message makes its identity routable."""
        sync_input_socket: zmq.SyncSocket = zmq.Socket.shadow(self.input_socket)
        timeout_ms = envs.VLLM_ENGINE_READY_TIMEOUT_S * 1000
        identities = set(self.core_engines)
        while identities:
            if not sync_input_socket.poll(timeout=timeout_ms):
                raise TimeoutError(
                    "Timed out waiting for the engine core(s) to connect their input socket."
                )
            identity, _ = sync_input_socket.recv_multipart()
            if identity not in identities:
                raise RuntimeError(f"Unexpected engine identity {identity!r}")
            identities.discard(identity)

    def _start_engine_core_monitor(self) -> None:
        """A thread that notices an engine core (or the DP coordinator) exiting:
        any of them dying makes the whole client dead, as upstream."""
        engine_manager = self.resources.engine_manager
        coordinator = self.resources.coordinator
        sentinels = engine_manager.sentinels() if engine_manager is not None else []
        if coordinator is not None:
            sentinels.append(coordinator.proc.sentinel)
        if not sentinels:
            return  # engines started (and watched) by the parent process
        resources_ref = weakref.ref(self.resources)

        def monitor_engine_cores() -> None:
            block_shutdown_signals()
            multiprocessing.connection.wait(sentinels)
            resources = resources_ref()
            if resources is None or resources.engine_dead or resources.closing:
                return
            finished = engine_manager.finished_procs() if engine_manager is not None else {}
            if coordinator is not None and coordinator.proc.exitcode is not None:
                finished[coordinator.proc.name or "DPCoordinator"] = coordinator.proc.exitcode
            logger.error("Engine core proc %s died unexpectedly, shutting down client.", finished)
            resources.mark_dead()

        threading.Thread(
            target=monitor_engine_cores, daemon=True, name="MPClientEngineMonitor"
        ).start()

    def shutdown(self) -> None:
        """Stop the engine process and close the sockets (idempotent)."""
        self._finalizer()

    def ensure_alive(self) -> None:
        if self.resources.engine_dead:
            raise EngineDeadError()

    def _encode_input(
        self, request_type: EngineCoreRequestType, request: Any, engine: bytes | None = None
    ) -> tuple[Any, ...]:
        target = self.core_engine if engine is None else engine
        return (target, request_type.value, *self.encoder.encode(request))

    @staticmethod
    def _new_call_id() -> int:
        return uuid.uuid1().int >> 64


class SyncMPClient(MPClient):
    """Synchronous client of an engine core process (the `LLM` default)."""

    def __init__(
        self, vllm_config: VllmConfig, executor_class: type[Executor], log_stats: bool
    ) -> None:
        super().__init__(
            asyncio_mode=False,
            vllm_config=vllm_config,
            executor_class=executor_class,
            log_stats=log_stats,
        )
        self.outputs_queue: queue.Queue[EngineCoreOutputs | Exception] = queue.Queue()
        self._send_lock = threading.Lock()
        outputs_queue, utility_results = self.outputs_queue, self.utility_results

        # The callback must not hold the client: the finalizer keeps it alive.
        def on_dead() -> None:
            outputs_queue.put_nowait(EngineDeadError())
            _fail_pending_utilities(utility_results)

        self.resources.on_engine_dead.append(on_dead)
        self.resources.shutdown_path = get_open_zmq_inproc_path()
        ready = threading.Event()
        # The thread gets what it needs, not the client (which must stay collectable).
        self.output_thread = threading.Thread(
            target=_process_outputs_socket,
            args=(self.resources, self.decoder, self.utility_results, outputs_queue, ready),
            daemon=True,
            name="EngineCoreOutputQueueThread",
        )
        self.output_thread.start()
        ready.wait()

    def get_output(self) -> EngineCoreOutputs:
        # With several waiters on a dead engine, each must get the error.
        if self.resources.engine_dead and self.outputs_queue.empty():
            raise EngineDeadError()
        while True:
            try:
                # Timed, so that Ctrl-C reaches a caller blocked here.
                outputs = self.outputs_queue.get(timeout=1.0)
                break
            except queue.Empty:
                continue
        if isinstance(outputs, Exception):
            if isinstance(outputs, EngineDeadError):
                raise EngineDeadError(suppress_context=True)
            raise outputs
        return outputs

    def _send_input(self, request_type: EngineCoreRequestType, request: Any) -> None:
        self.ensure_alive()
        with self._send_lock:
            self.input_socket.send_multipart(self._encode_input(request_type, request), copy=False)

    def call_utility(self, method: str, *args: Any) -> Any:
        call_id = self._new_call_id()
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.utility_results[call_id] = future
        self._send_input(EngineCoreRequestType.UTILITY, (0, call_id, method, args))
        return future.result()

    def add_request(self, request: EngineCoreRequest) -> None:
        self._send_input(EngineCoreRequestType.ADD, request)

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids and not self.resources.engine_dead:
            self._send_input(EngineCoreRequestType.ABORT, request_ids)

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        reset: bool = self.call_utility("reset_prefix_cache", reset_running_requests)
        return reset

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        _check_rpc_method(method)
        results: list[Any] = self.call_utility("collective_rpc", method, timeout, args, kwargs)
        return results

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        self.call_utility("sleep", level, mode)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.call_utility("wake_up", tags)

    def is_sleeping(self) -> bool:
        sleeping: bool = self.call_utility("is_sleeping")
        return sleeping

    def add_lora(self, lora_request: LoRARequest) -> bool:
        with _lora_not_found(lora_request):
            return bool(self.call_utility("add_lora", lora_request))

    def remove_lora(self, lora_id: int) -> bool:
        return bool(self.call_utility("remove_lora", lora_id))

    def list_loras(self) -> set[int]:
        return set(self.call_utility("list_loras"))  # a set travels as a list

    def pin_lora(self, lora_id: int) -> bool:
        return bool(self.call_utility("pin_lora", lora_id))


def _process_outputs_socket(
    resources: BackgroundResources,
    decoder: MsgpackDecoder,
    utility_results: dict[int, AnyFuture],
    outputs_queue: queue.Queue[EngineCoreOutputs | Exception],
    ready: threading.Event,
) -> None:
    """SyncMPClient's output thread: decode outputs until shutdown or engine death."""
    block_shutdown_signals()
    output_socket = resources.output_socket
    assert output_socket is not None and resources.shutdown_path is not None
    shutdown_socket = resources.ctx.socket(zmq.PAIR)
    shutdown_socket.bind(resources.shutdown_path)
    ready.set()
    poller = zmq.Poller()
    poller.register(shutdown_socket, zmq.POLLIN)
    poller.register(output_socket, zmq.POLLIN)
    try:
        while True:
            socks = dict(poller.poll())
            if shutdown_socket in socks:
                break
            frames = output_socket.recv_multipart(copy=False)
            resources.validate_alive(frames)
            outputs = decoder.decode([f.buffer for f in frames])
            if outputs.utility_output is not None:
                _process_utility_output(outputs.utility_output, utility_results)
            else:
                _restore_stats(outputs)
                outputs_queue.put_nowait(outputs)
    except EngineDeadError:
        pass  # mark_dead() already told every waiter
    except Exception as e:
        outputs_queue.put_nowait(e)
    finally:
        shutdown_socket.close(linger=0)
        output_socket.close(linger=0)


class AsyncMPClient(MPClient):
    """Asyncio client of an engine core process (AsyncLLM's)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        executor_class: type[Executor],
        log_stats: bool,
        client_addresses: dict[str, Any] | None = None,
        client_count: int = 1,
        client_index: int = 0,
    ) -> None:
        super().__init__(
            asyncio_mode=True,
            vllm_config=vllm_config,
            executor_class=executor_class,
            log_stats=log_stats,
            client_addresses=client_addresses,
            client_count=client_count,
            client_index=client_index,
        )
        self.outputs_queue: asyncio.Queue[EngineCoreOutputs | Exception] = asyncio.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self_ref = weakref.ref(self)

        def on_dead() -> None:
            client = self_ref()
            if client is not None:
                client._on_engine_dead()

        self.resources.on_engine_dead.append(on_dead)
        try:
            asyncio.get_running_loop()
            self._ensure_output_queue_task()
        except RuntimeError:
            pass  # started by the first call made inside an event loop

    def _on_engine_dead(self) -> None:
        """May run on the monitor thread: hop onto the event loop."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        def notify() -> None:
            self.outputs_queue.put_nowait(EngineDeadError())
            _fail_pending_utilities(self.utility_results)

        if _running_loop() is loop:
            notify()
        else:
            loop.call_soon_threadsafe(notify)

    def _ensure_output_queue_task(self) -> None:
        resources = self.resources
        if resources.output_queue_task is not None:
            return
        self._loop = asyncio.get_running_loop()
        output_socket = _async_socket(resources.output_socket)
        outputs_queue = self.outputs_queue
        decoder, utility_results = self.decoder, self.utility_results
        outputs_hook = self._make_outputs_hook()

        async def process_outputs_socket() -> None:
            try:
                while True:
                    frames = await output_socket.recv_multipart(copy=False)
                    resources.validate_alive(frames)
                    outputs = decoder.decode([f.buffer for f in frames])
                    if outputs.utility_output is not None:
                        _process_utility_output(outputs.utility_output, utility_results)
                        continue
                    _restore_stats(outputs)
                    if outputs_hook is not None:
                        outputs_hook(outputs)
                    outputs_queue.put_nowait(outputs)
            except EngineDeadError:
                pass  # mark_dead() already told every waiter
            except Exception as e:
                outputs_queue.put_nowait(e)

        resources.output_queue_task = asyncio.create_task(
            process_outputs_socket(), name="EngineCoreOutputQueueTask"
        )

    def _make_outputs_hook(self) -> Callable[[EngineCoreOutputs], None] | None:
        """A function called with each engine's outputs before they are queued
        (the DP load balancer's bookkeeping); it must not hold the client."""
        return None

    async def get_output_async(self) -> EngineCoreOutputs:
        self._ensure_output_queue_task()
        if self.resources.engine_dead and self.outputs_queue.empty():
            raise EngineDeadError()
        outputs = await self.outputs_queue.get()
        if isinstance(outputs, Exception):
            if isinstance(outputs, EngineDeadError):
                raise EngineDeadError(suppress_context=True)
            raise outputs
        return outputs

    async def _send_input(
        self, request_type: EngineCoreRequestType, request: Any, engine: bytes | None = None
    ) -> None:
        """Send to `engine` (a DP rank's identity; default: the first engine)."""
        self.ensure_alive()
        self._ensure_output_queue_task()
        await _async_socket(self.input_socket).send_multipart(
            self._encode_input(request_type, request, engine), copy=False
        )

    async def call_utility_async(self, method: str, *args: Any) -> Any:
        call_id = self._new_call_id()
        future = asyncio.get_running_loop().create_future()
        self.utility_results[call_id] = future
        await self._send_input(
            EngineCoreRequestType.UTILITY, (self.client_index, call_id, method, args)
        )
        return await future

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        request.client_index = self.client_index
        await self._send_input(EngineCoreRequestType.ADD, request)

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        if request_ids and not self.resources.engine_dead:
            await self._send_input(EngineCoreRequestType.ABORT, request_ids)

    async def reset_prefix_cache_async(self, reset_running_requests: bool = False) -> bool:
        reset: bool = await self.call_utility_async("reset_prefix_cache", reset_running_requests)
        return reset

    async def collective_rpc_async(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        _check_rpc_method(method)
        results: list[Any] = await self.call_utility_async(
            "collective_rpc", method, timeout, args, kwargs
        )
        return results

    async def sleep_async(self, level: int = 1, mode: str = "abort") -> None:
        await self.call_utility_async("sleep", level, mode)

    async def wake_up_async(self, tags: list[str] | None = None) -> None:
        await self.call_utility_async("wake_up", tags)

    async def is_sleeping_async(self) -> bool:
        sleeping: bool = await self.call_utility_async("is_sleeping")
        return sleeping

    async def add_lora_async(self, lora_request: LoRARequest) -> bool:
        with _lora_not_found(lora_request):
            return bool(await self.call_utility_async("add_lora", lora_request))

    async def remove_lora_async(self, lora_id: int) -> bool:
        return bool(await self.call_utility_async("remove_lora", lora_id))

    async def list_loras_async(self) -> set[int]:
        return set(await self.call_utility_async("list_loras"))

    async def pin_lora_async(self, lora_id: int) -> bool:
        return bool(await self.call_utility_async("pin_lora", lora_id))

    # The synchronous interface does not apply to an asyncio client.
    def get_output(self) -> EngineCoreOutputs:
        raise NotImplementedError("AsyncMPClient: use get_output_async()")

    def add_request(self, request: EngineCoreRequest) -> None:
        raise NotImplementedError("AsyncMPClient: use add_request_async()")

    def abort_requests(self, request_ids: list[str]) -> None:
        raise NotImplementedError("AsyncMPClient: use abort_requests_async()")

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        raise NotImplementedError("AsyncMPClient: use reset_prefix_cache_async()")

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        raise NotImplementedError("AsyncMPClient: use collective_rpc_async()")


@contextlib.contextmanager
def _lora_not_found(lora_request: LoRARequest) -> Iterator[None]:
    """A missing adapter raises LoRAAdapterNotFoundError, as in process."""
    try:
        yield
    except VLLMNotFoundError as e:
        if isinstance(e, LoRAAdapterNotFoundError):
            raise
        raise LoRAAdapterNotFoundError(lora_request.lora_name, lora_request.lora_path) from e


def _fail_pending_utilities(utility_results: dict[int, AnyFuture]) -> None:
    for future in list(utility_results.values()):
        if not future.done():
            future.set_exception(EngineDeadError())
    utility_results.clear()


def _async_socket(socket: zmq.Socket[Any] | None) -> zmq.asyncio.Socket:
    """AsyncMPClient's sockets, made on its zmq.asyncio context."""
    assert isinstance(socket, zmq.asyncio.Socket)
    return socket


def _check_rpc_method(method: str | Callable[..., Any]) -> None:
    if not isinstance(method, str):
        raise TypeError(
            "collective_rpc across processes takes a method name: functions "
            "are not sent to the engine core (that would need pickle). Use "
            "VLLM_ENABLE_V1_MULTIPROCESSING=0 to pass a callable."
        )


def _cancel_task(task: asyncio.Task[None]) -> None:
    """Cancel `task` from its loop's thread or any other."""
    loop = task.get_loop()
    if _running_loop() is loop:
        task.cancel()
    elif loop.is_running() and not loop.is_closed():
        loop.call_soon_threadsafe(task.cancel)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
