"""The data-parallel coordinator (upstream: vllm/v1/engine/coordinator.py).

One process between the DP engine cores and the front ends (DP > 1):

    engines --PUSH--> [PULL  back_output]   EngineCoreOutputs with only
                                            scheduler_stats / wave_complete /
                                            start_wave (client_index -1)
    engines <--SUB--- [XPUB  back_publish]  b"READY" once all subscribed, then
                                            (START_DP_WAVE, (wave, exclude_index))
    front ends <-SUB- [XPUB front_publish]  (counts per engine | None,
                                            current_wave, engines_running)
    front ends --->   [XPUB front_publish]  (engine_index, wave): a request was
                                            sent while the engines were paused

`counts` is a [waiting, running, kv_cache_usage] list per engine, published
at most every 100 ms while it changes (every 5 s otherwise): the front ends'
load balancer (DPLBAsyncMPClient) scores engines with it.

Waves (MoE models only, `enable_wave_coordination`): the engines step in
lock-step while any has work; the global "request wave" counts the running ->
paused transitions. Rank 0 reports `wave_complete`; a front end adding a
request while paused, or an engine receiving a request for a stale wave
(`start_wave`), makes the coordinator broadcast START_DP_WAVE so that every
engine runs the wave (idle ones with dummy batches). Dense models run the
coordinator for the stats only.

Every message is msgpack (never pickle).
"""

from __future__ import annotations

import copy
import multiprocessing
import multiprocessing.connection
import signal
import time
import weakref
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import msgspec
import zmq

from vllm.logger import init_logger
from vllm.utils.system_utils import get_mp_context, parent_only, set_process_title
from vllm.v1.engine import EngineCoreOutputs, EngineCoreRequestType
from vllm.v1.engine.ipc import (
    allow_zmq_host,
    exit_process,
    get_engine_client_zmq_addr,
    make_zmq_socket,
    watch_parent,
)
from vllm.v1.serial_utils import MsgpackDecoder

if TYPE_CHECKING:
    from vllm.config import ParallelConfig

logger = init_logger(__name__)

# How long the coordinator may take to bind its sockets and report them.
STARTUP_TIMEOUT_S = 120


class DPCoordinator:
    """Starts the coordinator process (in the front end that runs DP rank 0)
    and knows its addresses."""

    def __init__(
        self, parallel_config: ParallelConfig, enable_wave_coordination: bool = True
    ) -> None:
        dp_size = parallel_config.data_parallel_size
        assert dp_size > 1, "Coordinator only used for data parallel"
        host = parallel_config.data_parallel_master_ip
        # Front ends are on this node unless each node runs its own (hybrid /
        # external LB); engines are all local unless some are remote.
        front_local = not parallel_config.local_engines_only
        engines_local = dp_size == parallel_config.data_parallel_size_local
        context = get_mp_context()
        addr_reader, addr_writer = context.Pipe(duplex=False)
        death_reader, self._death_writer = context.Pipe(duplex=False)
        parent_only(self._death_writer)
        self.proc = context.Process(
            target=DPCoordinatorProc.run_coordinator,
            name="VLLM_DP_Coordinator",
            kwargs={
                "engine_count": dp_size,
                "front_publish_address": get_engine_client_zmq_addr(front_local, host),
                "back_output_address": get_engine_client_zmq_addr(engines_local, host),
                "back_publish_address": get_engine_client_zmq_addr(engines_local, host),
                "zmq_addr_pipe": addr_writer,
                "death_pipe": death_reader,
                "enable_wave_coordination": enable_wave_coordination,
            },
        )
        self.proc.start()
        addr_writer.close()
        death_reader.close()
        self._finalizer = weakref.finalize(self, _stop_coordinator, self.proc, self._death_writer)
        try:
            addresses = self._wait_for_zmq_addrs(addr_reader)
        except BaseException:
            self._finalizer()
            raise
        self.stats_publish_address, self.coord_out_address, self.coord_in_address = addresses

    def _wait_for_zmq_addrs(self, pipe: Connection) -> tuple[str, str, str]:
        try:
            ready = multiprocessing.connection.wait(
                [pipe, self.proc.sentinel], timeout=STARTUP_TIMEOUT_S
            )
            if not ready:
                raise RuntimeError(
                    "DP Coordinator process failed to report ZMQ addresses "
                    f"within timeout={STARTUP_TIMEOUT_S} seconds during startup."
                )
            try:
                front, back_output, back_publish = pipe.recv()
            except EOFError:
                raise RuntimeError("DP Coordinator process failed during startup.") from None
            return front, back_output, back_publish
        finally:
            pipe.close()

    def get_stats_publish_address(self) -> str:
        return self.stats_publish_address

    def get_engine_socket_addresses(self) -> tuple[str, str]:
        """(engines' input address: the coordinator's XPUB, engines' output
        address: its PULL)."""
        return self.coord_in_address, self.coord_out_address

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop the coordinator process (idempotent)."""
        self._finalizer()

    close = shutdown


def _stop_coordinator(proc: multiprocessing.process.BaseProcess, death_writer: Connection) -> None:
    from vllm.v1.engine.utils import shutdown_processes

    shutdown_processes([proc], [death_writer])


class EngineState:
    def __init__(self) -> None:
        # [waiting, running, kv_cache_usage]
        self.request_counts: list[int | float] = [0, 0, 0.0]


class DPCoordinatorProc:
    """The coordinator's loop (runs in its own process)."""

    def __init__(
        self,
        engine_count: int,
        min_stats_update_interval_ms: int = 100,
        enable_wave_coordination: bool = True,
    ) -> None:
        self.ctx = zmq.Context()
        self.engines = [EngineState() for _ in range(engine_count)]
        self.stats_update_interval_ms = min_stats_update_interval_ms
        self.enable_wave_coordination = enable_wave_coordination
        # Wave state.
        self.current_wave = 0
        self.engines_running = False
        # Stats state.
        self.stats_changed = False
        self.last_stats_step = -1
        self.last_stats_wave = -1
        self.last_step_counts: list[list[int | float]] | None = None
        self.decoder = MsgpackDecoder(EngineCoreOutputs)

    @staticmethod
    def run_coordinator(
        engine_count: int,
        front_publish_address: str,
        back_output_address: str,
        back_publish_address: str,
        zmq_addr_pipe: Connection | None = None,
        death_pipe: Connection | None = None,
        min_stats_update_interval_ms: int = 100,
        enable_wave_coordination: bool = True,
    ) -> None:
        """Process entry point: serve until SIGTERM or the parent dies."""

        def on_signal(signum: int, frame: Any) -> None:
            raise SystemExit()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        set_process_title("DPCoordinator")
        for address in (front_publish_address, back_output_address, back_publish_address):
            if address.startswith("tcp://"):
                # The parent checked it (the DP head node's address).
                allow_zmq_host(address[len("tcp://") :].rsplit(":", 1)[0])
        if death_pipe is not None:
            watch_parent(death_pipe)
        coordinator = DPCoordinatorProc(
            engine_count, min_stats_update_interval_ms, enable_wave_coordination
        )
        try:
            coordinator.process_input_socket(
                front_publish_address, back_output_address, back_publish_address, zmq_addr_pipe
            )
        except SystemExit:
            logger.debug("DP Coordinator process exiting")
        finally:
            if zmq_addr_pipe is not None:
                zmq_addr_pipe.close()
            coordinator.ctx.destroy(linger=0)
        exit_process(0)

    def process_input_socket(
        self,
        front_publish_address: str,
        back_output_address: str,
        back_publish_address: str,
        zmq_addr_pipe: Connection | None = None,
    ) -> None:
        publish_front = make_zmq_socket(self.ctx, front_publish_address, zmq.XPUB, bind=True)
        output_back = make_zmq_socket(self.ctx, back_output_address, zmq.PULL, bind=True)
        publish_back = make_zmq_socket(self.ctx, back_publish_address, zmq.XPUB, bind=True)
        if zmq_addr_pipe is not None:
            # The bound endpoints (a tcp port 0 is resolved here).
            zmq_addr_pipe.send(
                tuple(
                    sock.getsockopt_string(zmq.LAST_ENDPOINT)
                    for sock in (publish_front, output_back, publish_back)
                )
            )
            zmq_addr_pipe.close()
        # Every engine subscribes before any wave message is sent.
        for _ in self.engines:
            if publish_back.recv() != b"\x01":
                logger.error("DP Coordinator received an unexpected message from an engine")
                return
        publish_back.send(b"READY")
        logger.info("All engine subscriptions received by DP coordinator")
        self._serve(publish_front, output_back, publish_back)

    def _serve(
        self,
        publish_front: zmq.SyncSocket,
        output_back: zmq.SyncSocket,
        publish_back: zmq.SyncSocket,
    ) -> None:
        poller = zmq.Poller()
        for sock in (publish_front, publish_back, output_back):
            poller.register(sock, zmq.POLLIN)
        last_publish_ms = 0
        while True:
            elapsed = int(time.time() * 1000) - last_publish_ms
            wait_for = self.stats_update_interval_ms if self.stats_changed else 5000
            # Lock-step engines: wait at least 50 ms for a step's stats from all.
            min_timeout = 50 if self.enable_wave_coordination and not self.last_step_counts else 0
            events = dict(poller.poll(timeout=max(min_timeout, wait_for - elapsed)))
            if not events:
                publish_front.send(msgspec.msgpack.encode(self._stats_to_publish()))
                last_publish_ms = int(time.time() * 1000)
                continue
            wave_state_changed = False
            if publish_back in events:
                buffer = publish_back.recv()
                if buffer == b"\x01":
                    publish_back.send(b"READY")  # an engine (re)subscribed
                elif buffer != b"\x00":
                    logger.error("DP Coordinator received an unexpected message from engines")
            if publish_front in events:
                wave_state_changed |= self._on_front_end_message(publish_front, publish_back)
            if output_back in events:
                wave_state_changed |= self._on_engine_message(output_back.recv(), publish_back)
            if wave_state_changed:
                message = (None, self.current_wave, self.engines_running)
                publish_front.send(msgspec.msgpack.encode(message))

    def _stats_to_publish(self) -> tuple[Any, int, bool]:
        if self.last_step_counts is not None:
            counts, self.last_step_counts = self.last_step_counts, None
        else:
            counts = self._get_engine_counts()
            self.stats_changed = False
        return counts, self.current_wave, self.engines_running

    def _on_front_end_message(
        self, publish_front: zmq.SyncSocket, publish_back: zmq.SyncSocket
    ) -> bool:
        """A front end sent a request while the engines were paused: start a wave."""
        buffer = publish_front.recv()
        if buffer in (b"\x01", b"\x00"):
            return False  # (un)subscription
        if not self.enable_wave_coordination:
            return False
        try:
            engine_to_exclude, wave = msgspec.msgpack.decode(buffer)
        except (msgspec.DecodeError, TypeError, ValueError):
            logger.error("DP Coordinator dropped a malformed front-end message")
            return False
        if self.engines_running:
            return False
        if wave < self.current_wave:
            # A stale wave: every engine must get the message.
            engine_to_exclude = None
        self.engines_running = True
        self._send_start_wave(publish_back, self.current_wave, engine_to_exclude)
        return True

    def _on_engine_message(self, buffer: bytes, publish_back: zmq.SyncSocket) -> bool:
        outputs: EngineCoreOutputs = self.decoder.decode(buffer)
        eng_index = outputs.engine_index
        stats = outputs.scheduler_stats
        if stats and 0 <= eng_index < len(self.engines):
            self._record_stats(eng_index, stats)
        if not self.enable_wave_coordination:
            return False
        if (wave := outputs.wave_complete) is not None:
            # Rank 0: all engines moved to the paused state.
            if self.current_wave <= wave:
                logger.debug("Moving DP wave from %d to %d.", self.current_wave, wave + 1)
                self.current_wave = wave + 1
                self.engines_running = False
                return True
        elif (wave := outputs.start_wave) is not None and (
            wave > self.current_wave or (wave == self.current_wave and not self.engines_running)
        ):
            # An engine got a request for a wave the others have not started.
            logger.debug("Starting wave %d after notification of stale wave request.", wave)
            self.current_wave = wave
            self.engines_running = True
            self._send_start_wave(publish_back, wave, eng_index)
            return True
        return False

    def _record_stats(self, eng_index: int, stats: dict[str, Any]) -> None:
        """An engine's queue lengths (stats arrive as the SchedulerStats dict)."""
        if self.enable_wave_coordination:
            # Lock-step steps: snapshot the counts at each step boundary.
            step, wave = int(stats.get("step_counter", 0)), int(stats.get("current_wave", 0))
            if wave > self.last_stats_wave or (
                wave == self.last_stats_wave and step > self.last_stats_step
            ):
                if self.stats_changed:
                    self.last_step_counts = self._get_engine_counts(do_copy=True)
                self.last_stats_step, self.last_stats_wave = step, wave
        counts = self.engines[eng_index].request_counts
        counts[0] = int(stats.get("num_waiting_reqs", 0))
        counts[1] = int(stats.get("num_running_reqs", 0))
        counts[2] = float(stats.get("kv_cache_usage", 0.0))
        self.stats_changed = True

    @staticmethod
    def _send_start_wave(
        socket: zmq.SyncSocket, wave: int, exclude_engine_index: int | None
    ) -> None:
        """Broadcast START_DP_WAVE; the excluded engine already has a request
        of this wave."""
        payload = msgspec.msgpack.encode((wave, exclude_engine_index))
        socket.send_multipart((EngineCoreRequestType.START_DP_WAVE.value, payload))

    def _get_engine_counts(self, do_copy: bool = False) -> list[list[int | float]]:
        if do_copy:
            return [copy.copy(e.request_counts) for e in self.engines]
        return [e.request_counts for e in self.engines]
