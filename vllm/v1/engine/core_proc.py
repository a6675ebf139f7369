"""The engine core in its own process (upstream: `EngineCoreProc` in
vllm/v1/engine/core.py, re-exported from there).

Three threads:

    input thread:   DEALER socket(s) -> decode -> input_queue
    main thread:    run_busy_loop(): drain input_queue (block when idle)
                    -> step() -> output_queue
    output thread:  output_queue -> encode -> PUSH socket(s)

so that (de)serialization and socket IO overlap with the model's forward
pass. Input frames are `(type_byte, *msgpack frames)`: ADD carries an
`EngineCoreRequest`, ABORT a `list[str]` of request ids, UTILITY a
`(client_index, call_id, method_name, args)` call whose result is returned
in `EngineCoreOutputs.utility_output`.

A fatal error in the busy loop sends ENGINE_CORE_DEAD to the clients before
the process exits; malformed or invalid input is request-scoped: it is
logged and (when the request id is known) answered with an ERROR output.
"""

from __future__ import annotations

import contextlib
import inspect
import queue
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, ClassVar, get_type_hints

import msgspec
import zmq

from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.utils.system_utils import set_process_title
from vllm.v1.engine import (
    UTILITY_ERROR_KINDS,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineCoreRequestType,
    FinishReason,
    UtilityOutput,
    UtilityResult,
)
from vllm.v1.engine.engine_core import EngineCore
from vllm.v1.engine.ipc import (
    EngineZmqAddresses,
    allow_zmq_host,
    block_shutdown_signals,
    decode_handshake,
    encode_handshake,
    exit_process,
    make_zmq_socket,
    watch_parent,
)
from vllm.v1.metrics.stats import SchedulerStats
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

if TYPE_CHECKING:
    from vllm.v1.executor.abstract import Executor

logger = init_logger(__name__)

POLLING_TIMEOUT_MS = 1000
# How long an engine waits for the front end's answer to its HELLO.
HANDSHAKE_TIMEOUT_S = 5 * 60
IDLE_WAIT_S = 0.5
# Output-queue sentinel: the output thread stops.
_SHUTDOWN = object()


class EngineCoreProc(EngineCore):
    """ZMQ wrapper around `EngineCore`, run by `run_engine_core` in a child process."""

    ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"
    # DPEngineCoreProc (MoE): the DP ranks step together; else each rank is
    # an independent engine.
    lockstep_dp: ClassVar[bool] = False

    def __init__(
        self,
        vllm_config: VllmConfig,
        local_client: bool,
        handshake_address: str,
        executor_class: type[Executor],
        log_stats: bool,
        client_handshake_address: str | None = None,
        engine_index: int = 0,
    ) -> None:
        self.input_queue: queue.Queue[tuple[EngineCoreRequestType, Any]] = queue.Queue()
        self.output_queue: queue.Queue[Any] = queue.Queue()
        self.engine_index = engine_index
        self.engines_running = False
        self._shutdown_event = threading.Event()
        identity = engine_index.to_bytes(length=2, byteorder="little")

        def executor_fail_callback() -> None:
            self.input_queue.put_nowait((EngineCoreRequestType.EXECUTOR_FAILED, b""))

        with self._perform_handshake(
            handshake_address, identity, local_client, vllm_config
        ) as addresses:
            if vllm_config.parallel_config.data_parallel_size > 1 and not self.lockstep_dp:
                # A dense model's DP rank is an independent engine (DP=1); after
                # the handshake, which checked the DP sizes.
                vllm_config.parallel_config.reconfigure_for_independent_dp_rank()
            # DP > 1: the coordinator takes this engine's queue stats (internal
            # load balancing) and, for MoE models, runs the waves.
            self.has_coordinator = addresses.coordinator_output is not None
            self.publish_dp_lb_stats = (
                self.has_coordinator and not vllm_config.parallel_config.data_parallel_external_lb
            )
            self.last_counts = (0, 0)
            self._init_data_parallel(vllm_config)
            super().__init__(
                vllm_config,
                executor_class,
                log_stats,
                executor_fail_callback,
                include_finished_set=self.publish_dp_lb_stats,
            )
        if not hasattr(self, "step_fn"):
            batch_queue = getattr(self, "batch_queue", None)
            self.step_fn = self.step if batch_queue is None else self.step_with_batch_queue

        ready_event = threading.Event()
        self.input_thread = threading.Thread(
            target=self.process_input_sockets,
            args=(addresses.inputs, addresses.coordinator_input, identity, ready_event),
            daemon=True,
            name="EngineCoreInput",
        )
        self.input_thread.start()
        self.output_thread = threading.Thread(
            target=self.process_output_sockets,
            args=(addresses.outputs, addresses.coordinator_output, engine_index),
            daemon=True,
            name="EngineCoreOutput",
        )
        self.output_thread.start()
        # With a coordinator, not ready before its READY (all engines subscribed).
        while not ready_event.wait(timeout=10):
            if not self.input_thread.is_alive():
                raise RuntimeError("Input socket thread died during startup")
            logger.info("Waiting for READY message from DP Coordinator...")

    # ------------------------------------------------------------------
    # Start-up
    # ------------------------------------------------------------------

    @contextlib.contextmanager
    def _perform_handshake(
        self, handshake_address: str, identity: bytes, local_client: bool, vllm_config: VllmConfig
    ) -> Iterator[EngineZmqAddresses]:
        """HELLO -> addresses (and the DP settings the front end chose); then
        (after the body: engine init) READY or FAILED. A remote (headless)
        engine reaches the head node over tcp."""
        ctx = zmq.Context()
        parallel_config = vllm_config.parallel_config
        allow_zmq_host(parallel_config.data_parallel_master_ip)
        try:
            socket = make_zmq_socket(
                ctx, handshake_address, zmq.DEALER, bind=False, identity=identity, linger=5000
            )
            hello = {
                "status": "HELLO",
                "local": local_client,
                "headless": not local_client,
                "data_parallel_size": parallel_config.data_parallel_size,
            }
            socket.send(encode_handshake(hello))
            if not socket.poll(timeout=HANDSHAKE_TIMEOUT_S * 1000):
                raise RuntimeError(
                    f"Did not receive a handshake reply from the front end at "
                    f"{handshake_address} within {HANDSHAKE_TIMEOUT_S} s"
                )
            reply = decode_handshake(socket.recv())
            addresses = EngineZmqAddresses.from_handshake(reply["addresses"])
            for key, value in (reply.get("parallel_config") or {}).items():
                setattr(parallel_config, key, value)
            try:
                yield addresses
            except BaseException as e:
                error = f"{type(e).__name__}: {e}"
                socket.send(
                    encode_handshake({"status": "FAILED", "local": local_client, "error": error})
                )
                raise
            model_config = self.vllm_config.model_config
            assert model_config is not None  # EngineCore.__init__ checked it
            socket.send(
                encode_handshake(
                    {
                        "status": "READY",
                        "local": local_client,
                        "num_gpu_blocks": self.vllm_config.cache_config.num_gpu_blocks or 0,
                        "max_model_len": model_config.max_model_len,
                    }
                )
            )
        finally:
            ctx.destroy(linger=5000)

    @staticmethod
    def run_engine_core(
        *,
        dp_rank: int = 0,
        local_dp_rank: int = 0,
        death_pipe: Connection | None = None,
        **kwargs: Any,
    ) -> None:
        """Entry point of the engine-core process (spawned by the client; every
        argument is a keyword: `kwargs` are EngineCoreProc's)."""
        shutdown_requested = False

        def signal_handler(signum: int, frame: Any) -> None:
            nonlocal shutdown_requested
            if not shutdown_requested:
                shutdown_requested = True
                raise SystemExit()

        # SIGTERM from the client's shutdown, SIGINT from a terminal's Ctrl-C.
        signal.signal(signal.SIGTERM, signal_handler)
        signal.signal(signal.SIGINT, signal_handler)
        if death_pipe is not None:
            watch_parent(death_pipe)
        engine_core: EngineCoreProc | None = None
        exit_code = 1
        try:
            engine_core = _make_engine_core(dp_rank, local_dp_rank, kwargs)
            engine_core.run_busy_loop()
        except SystemExit:
            logger.debug("EngineCore exiting.")
            exit_code = 0
        except Exception:
            if engine_core is None:
                logger.exception("EngineCore failed to start.")
            else:
                logger.exception("EngineCore encountered a fatal error.")
                engine_core._send_engine_dead()
        finally:
            if engine_core is not None:
                engine_core.shutdown()
            exit_process(exit_code)

    def _init_data_parallel(self, vllm_config: VllmConfig) -> None:
        """DPEngineCoreProc's hook (its DP group), before the engine is built."""

    # ------------------------------------------------------------------
    # The busy loop
    # ------------------------------------------------------------------

    def run_busy_loop(self) -> None:
        """Serve until the process is told to stop: input, step, repeat."""
        while True:
            self._process_input_queue()
            # Before and after the step, so the load balancer sees fresh counts.
            self._maybe_publish_request_counts()
            self._process_engine_step()
            self._maybe_publish_request_counts()

    def _maybe_publish_request_counts(self) -> None:
        """DP: send this engine's (running, waiting) counts to the coordinator
        (client index -1) when they change."""
        if not self.publish_dp_lb_stats:
            return
        counts = self.scheduler.get_request_counts()
        if counts != self.last_counts:
            self.last_counts = counts
            stats = SchedulerStats(
                num_running_reqs=counts[0],
                num_waiting_reqs=counts[1],
                kv_cache_usage=self.scheduler.kv_cache_manager.usage,
            )
            self.output_queue.put_nowait((-1, EngineCoreOutputs(scheduler_stats=stats)))

    def _has_work(self) -> bool:
        if self.sleep_manager.paused:
            return False  # asleep: only input (wake_up) is handled
        if self.sleep_manager.sleep_pending:
            return True  # a "wait" sleep falls asleep from the step loop
        batch_queue = getattr(self, "batch_queue", None)
        return self.engines_running or self.scheduler.has_requests() or bool(batch_queue)

    def _process_input_queue(self) -> None:
        """Block for input while idle, then drain what arrived."""
        waited = False
        while not self._has_work():
            if not waited and self.input_queue.empty():
                logger.debug("EngineCore waiting for work.")
                waited = True
            try:
                # Timed: a signal taken by another thread must not leave the
                # main thread blocked here, unable to run the SIGTERM handler.
                request = self.input_queue.get(timeout=IDLE_WAIT_S)
            except queue.Empty:
                continue
            self._handle_client_request(*request)
        while not self.input_queue.empty():
            self._handle_client_request(*self.input_queue.get_nowait())

    def _process_engine_step(self) -> bool:
        """One step; its outputs go to the output thread."""
        if self.sleep_manager.paused:
            return False  # a sleep utility arrived with the last input
        outputs, model_executed = self.step_fn()
        # step_with_batch_queue returns None while its first batch is in flight.
        for output in outputs.items() if outputs else ():
            self.output_queue.put_nowait(output)
        if not model_executed and self.scheduler.has_unfinished_requests():
            # As upstream: nothing ran but requests wait (a grammar still
            # compiling): yield briefly instead of spinning, which flooded the
            # front end with a stats message per spin and starved the compile
            # threads (a 40k-item enum stalled every other route for ~40 s).
            time.sleep(0.001)
        self.sleep_manager.maybe_fall_asleep()  # sleep mode "wait", once nothing is in flight
        return model_executed

    def _handle_client_request(self, request_type: EngineCoreRequestType, request: Any) -> None:
        if request_type == EngineCoreRequestType.ADD:
            req, request_wave = request
            if self.sleep_manager.paused:
                # Upstream's sleep: requests are accepted and wait for wake_up.
                logger.info("Engine is sleeping: request %s waits for wake_up.", req.request_id)
            try:
                self.add_request(req, request_wave)
            except Exception as e:
                # Request-scoped: answer this request with an error, keep serving.
                logger.error("Rejected request %s: %s", req.request_id, e)
                self._send_request_error(req.request_id, req.client_index)
        elif request_type == EngineCoreRequestType.ABORT:
            self.abort_requests(request)
        elif request_type == EngineCoreRequestType.UTILITY:
            self._handle_utility(*request)
        elif request_type == EngineCoreRequestType.EXECUTOR_FAILED:
            raise RuntimeError(request if isinstance(request, str) else "Executor failed.")
        else:
            logger.error("Unrecognized input request type: %s", request_type)

    def _handle_utility(
        self, client_idx: int, call_id: int, method_name: str, args: list[Any]
    ) -> None:
        output = UtilityOutput(call_id)
        try:
            if method_name.startswith("_") or method_name in _NOT_UTILITIES:
                raise AttributeError(f"{method_name} is not a utility method")
            method = getattr(self, method_name)
            result = method(*_convert_msgspec_args(method, args))
            if isinstance(result, Future):
                # Answered when it resolves (sleep mode "wait"), on the busy loop.
                result.add_done_callback(
                    lambda f: self._send_utility_future(client_idx, call_id, method_name, f)
                )
                return
            output.result = UtilityResult(result)
        except Exception as e:
            logger.exception("Invocation of %s method failed", method_name)
            _set_failure(output, method_name, e)
        self.output_queue.put_nowait((client_idx, EngineCoreOutputs(utility_output=output)))

    def _send_utility_future(
        self, client_idx: int, call_id: int, method_name: str, future: Future[Any]
    ) -> None:
        output = UtilityOutput(call_id)
        if (e := future.exception()) is not None:
            logger.error("Invocation of %s method failed: %s", method_name, e)
            _set_failure(output, method_name, e)
        else:
            output.result = UtilityResult(future.result())
        self.output_queue.put_nowait((client_idx, EngineCoreOutputs(utility_output=output)))

    def _emit_outputs(self, outputs: dict[int, EngineCoreOutputs]) -> None:
        """Outputs made outside the busy loop's step (sleep's aborts)."""
        for client_index, client_outputs in outputs.items():
            self.output_queue.put_nowait((client_index, client_outputs))

    def _send_request_error(self, request_id: str, client_index: int) -> None:
        eco = EngineCoreOutput(
            request_id=request_id, new_token_ids=[], finish_reason=FinishReason.ERROR
        )
        self.output_queue.put_nowait((client_index, EngineCoreOutputs(outputs=[eco])))

    def _send_engine_dead(self) -> None:
        """Tell the clients the engine is gone, and let the output thread flush it."""
        self.output_queue.put_nowait(EngineCoreProc.ENGINE_CORE_DEAD)
        self.output_thread.join(timeout=5.0)
        if self.output_thread.is_alive():
            logger.fatal(
                "vLLM shutdown signal from EngineCore failed to send. Please report this issue."
            )

    # ------------------------------------------------------------------
    # Socket threads
    # ------------------------------------------------------------------

    def _thread_failed(self, name: str) -> None:
        """A socket thread crashed: the engine cannot serve; make the busy loop
        fail (clients then get ENGINE_CORE_DEAD, or see the process exit)."""
        logger.exception("EngineCore %s thread failed.", name)
        self.input_queue.put_nowait(
            (EngineCoreRequestType.EXECUTOR_FAILED, f"EngineCore {name} thread failed")
        )

    def process_input_sockets(
        self,
        input_addresses: list[str],
        coord_input_address: str | None,
        identity: bytes,
        ready_event: threading.Event,
    ) -> None:
        """Input thread: receive, decode and queue client (and coordinator) messages."""
        block_shutdown_signals()
        try:
            self._run_input_sockets(input_addresses, coord_input_address, identity, ready_event)
        except Exception:
            self._thread_failed("input")

    def _run_input_sockets(
        self,
        input_addresses: list[str],
        coord_input_address: str | None,
        identity: bytes,
        ready_event: threading.Event,
    ) -> None:
        decoders = (MsgpackDecoder(EngineCoreRequest), MsgpackDecoder())
        with zmq.Context() as ctx:
            sockets = [
                make_zmq_socket(ctx, addr, zmq.DEALER, bind=False, identity=identity, linger=0)
                for addr in input_addresses
            ]
            poller = zmq.Poller()
            for socket in sockets:
                # An empty first message tells the client's ROUTER who we are.
                socket.send(b"")
                poller.register(socket, zmq.POLLIN)
            if coord_input_address is not None:
                coord_socket = make_zmq_socket(
                    ctx, coord_input_address, zmq.XSUB, bind=False, identity=identity, linger=0
                )
                sockets.append(coord_socket)
                coord_socket.send(b"\x01")  # subscribe to everything
                self._wait_for_coordinator_ready(coord_socket)
                poller.register(coord_socket, zmq.POLLIN)
            ready_event.set()
            while not self._shutdown_event.is_set():
                for socket, _ in poller.poll(timeout=POLLING_TIMEOUT_MS):
                    frames = socket.recv_multipart(copy=False)
                    if bytes(frames[0].buffer) == b"READY":
                        continue  # the coordinator's answer to a (re)subscription
                    self._handle_input_frames(frames, *decoders)
            for socket in sockets:
                socket.close(linger=0)

    def _wait_for_coordinator_ready(self, coord_socket: zmq.SyncSocket) -> None:
        """The coordinator says READY once every engine has subscribed."""
        while not self._shutdown_event.is_set():
            if coord_socket.poll(timeout=POLLING_TIMEOUT_MS):
                message = coord_socket.recv()
                if message != b"READY":
                    raise RuntimeError(f"Unexpected message from the DP coordinator: {message!r}")
                return

    def _handle_input_frames(
        self, frames: list[Any], add_decoder: MsgpackDecoder, generic_decoder: MsgpackDecoder
    ) -> None:
        """Decode one message and queue it; anything malformed is dropped."""
        try:
            request_type = EngineCoreRequestType(bytes(frames[0].buffer))
            data = [f.buffer for f in frames[1:]]
            if request_type == EngineCoreRequestType.ADD:
                request = add_decoder.decode(data)
                try:
                    # Block hashing happens here, off the busy loop.
                    self.input_queue.put_nowait(
                        (request_type, self.preprocess_add_request(request))
                    )
                except Exception as e:
                    logger.error("Invalid request %s: %s", request.request_id, e)
                    self._send_request_error(request.request_id, request.client_index)
                return
            payload = generic_decoder.decode(data)
            _check_payload(request_type, payload)
            self.input_queue.put_nowait((request_type, payload))
        except Exception as e:
            logger.error("Dropping a malformed message on the input socket: %s", e)

    def process_output_sockets(
        self, output_paths: list[str], coord_output_path: str | None, engine_index: int
    ) -> None:
        """Output thread: encode outputs and push them to their client (index
        -1: the DP coordinator)."""
        block_shutdown_signals()
        try:
            self._run_output_sockets(output_paths, coord_output_path, engine_index)
        except Exception:
            self._thread_failed("output")

    def _run_output_sockets(
        self, output_paths: list[str], coord_output_path: str | None, engine_index: int
    ) -> None:
        encoder = MsgpackEncoder()
        with zmq.Context() as ctx:
            sockets = [
                make_zmq_socket(ctx, path, zmq.PUSH, bind=False, linger=4000)
                for path in output_paths
            ]
            if coord_output_path is not None:
                # Last: index -1 of `sockets` is the coordinator's.
                sockets.append(make_zmq_socket(ctx, coord_output_path, zmq.PUSH, bind=False))
            # On a requested shutdown nobody waits for pending outputs: drop
            # them; the death notice is worth waiting a little for.
            linger = 0
            try:
                while True:
                    output = self.output_queue.get()
                    if output is _SHUTDOWN:
                        break
                    if output == EngineCoreProc.ENGINE_CORE_DEAD:
                        for socket in sockets[: len(output_paths)]:
                            socket.send(output)
                        linger = 4000
                        break
                    client_index, outputs = output
                    outputs.engine_index = engine_index
                    sockets[client_index].send_multipart(_encode(encoder, outputs), copy=False)
            finally:
                for socket in sockets:
                    socket.close(linger=linger)

    def shutdown(self) -> None:
        self._shutdown_event.set()
        output_thread = getattr(self, "output_thread", None)
        if output_thread is not None and output_thread.is_alive():
            self.output_queue.put_nowait(_SHUTDOWN)
            output_thread.join(timeout=5.0)
        super().shutdown()


# Public methods of EngineCoreProc that a client must not call remotely.
_NOT_UTILITIES = frozenset(
    (
        "run_busy_loop",
        "run_engine_core",
        "process_input_sockets",
        "process_output_sockets",
        "shutdown",
        "step",
        "step_fn",
        "step_with_batch_queue",
        "add_request",
        "preprocess_add_request",
    )
)


def _convert_msgspec_args(method: Any, args: list[Any]) -> list[Any]:
    """Utility arguments arrive untyped: a msgspec struct (a LoRARequest) is
    a msgpack array. Rebuild each argument whose parameter is annotated with a
    msgspec struct type, validating it (upstream's `_convert_msgspec_args`)."""
    if not args:
        return args
    try:
        hints = get_type_hints(method)
    except (NameError, TypeError):  # annotations naming types only imported for mypy
        return args
    params = list(inspect.signature(method).parameters)
    converted = list(args)
    for i, (name, value) in enumerate(zip(params, args)):
        t = hints.get(name)
        if isinstance(t, type) and issubclass(t, msgspec.Struct) and not isinstance(value, t):
            converted[i] = msgspec.convert(value, type=t)
    return converted


def _set_failure(output: UtilityOutput, method_name: str, e: BaseException) -> None:
    output.failure_message = f"Call to {method_name} method failed: {e}"
    output.failure_kind = next(
        (kind for kind, cls in UTILITY_ERROR_KINDS if isinstance(e, cls)), None
    )


def _encode(encoder: MsgpackEncoder, outputs: EngineCoreOutputs) -> Any:
    """Encode; a utility result that cannot be sent becomes a failure message
    for that call (instead of killing the output thread)."""
    try:
        return encoder.encode(outputs)
    except TypeError as e:
        utility = outputs.utility_output
        if utility is None:
            raise
        utility.result = None
        utility.failure_message = f"The result could not be sent to the client: {e}"
        return encoder.encode(outputs)


def _check_payload(request_type: EngineCoreRequestType, payload: Any) -> None:
    """Shape checks of the untyped messages (ABORT, UTILITY)."""
    if request_type == EngineCoreRequestType.ABORT:
        if not (isinstance(payload, list) and all(isinstance(r, str) for r in payload)):
            raise ValueError("ABORT carries a list of request ids")
    elif request_type == EngineCoreRequestType.START_DP_WAVE:
        if not (isinstance(payload, list) and len(payload) == 2 and isinstance(payload[0], int)):
            raise ValueError("START_DP_WAVE carries (wave, exclude_engine_index)")
    elif request_type == EngineCoreRequestType.UTILITY:
        ok = (
            isinstance(payload, list)
            and len(payload) == 4
            and isinstance(payload[0], int)
            and isinstance(payload[1], int)
            and isinstance(payload[2], str)
            and isinstance(payload[3], list)
        )
        if not ok:
            raise ValueError("UTILITY carries (client_index, call_id, method, args)")
    else:
        raise ValueError(f"Unexpected request type {request_type} from a client")


def _make_engine_core(dp_rank: int, local_dp_rank: int, kwargs: dict[str, Any]) -> EngineCoreProc:
    """The engine of DP rank `dp_rank`: an MoE model's ranks run in lock-step
    (DPEngineCoreProc, vllm/v1/engine/core_dp.py); a dense model's ranks are
    independent engines that behave as DP=1 (engine_index = the rank), as
    upstream's run_engine_core."""
    vllm_config: VllmConfig = kwargs["vllm_config"]
    parallel_config = vllm_config.parallel_config
    data_parallel = parallel_config.data_parallel_size > 1 or dp_rank > 0
    set_process_title(f"EngineCore_DP{dp_rank}" if data_parallel else "EngineCore")
    if data_parallel:
        parallel_config.data_parallel_rank_local = local_dp_rank
    parallel_config.data_parallel_index = dp_rank
    assert vllm_config.model_config is not None
    if data_parallel and vllm_config.model_config.is_moe:
        parallel_config.data_parallel_rank = dp_rank
        try:
            from vllm.v1.engine.core_dp import DPEngineCoreProc
        except ImportError as e:
            raise NotImplementedError(
                "data_parallel_size > 1 (--data-parallel-size) with an MoE model needs the "
                "lock-step DP engine (vllm/v1/engine/core_dp.py), which is not built yet."
            ) from e
        engine: EngineCoreProc = DPEngineCoreProc(engine_index=dp_rank, **kwargs)
        return engine
    return EngineCoreProc(engine_index=dp_rank, **kwargs)
