"""The data-parallel engine-core clients (upstream: `DPAsyncMPClient` and
`DPLBAsyncMPClient` in vllm/v1/engine/core_client.py, which re-exports them
from here).

    DPAsyncMPClient    several engine cores (DP ranks); requests go to the
                       engine named by `data_parallel_rank`, else the first
                       (external load balancing: one client per rank).
    DPLBAsyncMPClient  internal load balancing: each request goes to the
                       engine with the lowest load score, from the DP
                       coordinator's queue stats and this client's own
                       in-flight counts; aborts follow the request.

Both subscribe to the coordinator's stats (a task on the event loop) and,
when a request is sent while the engines are paused (MoE waves), tell the
coordinator so that it starts the wave on every engine. Utility calls (sleep,
LoRA, collective RPCs, prefix-cache reset) fan out to every engine and return
the first engine's result, as upstream.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
import zmq
import zmq.asyncio

from vllm.logger import init_logger
from vllm.v1.engine import EngineCoreOutputs, EngineCoreRequest, EngineCoreRequestType
from vllm.v1.engine.core_client_mp import AsyncMPClient
from vllm.v1.engine.ipc import get_open_zmq_inproc_path, make_zmq_socket

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.executor.abstract import Executor

logger = init_logger(__name__)

EngineIdentity = bytes


class DPAsyncMPClient(AsyncMPClient):
    """Asyncio client of several engine cores (data parallel); external load
    balancing by default (the request's `data_parallel_rank`, else the first)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        executor_class: type[Executor],
        log_stats: bool,
        client_addresses: dict[str, Any] | None = None,
        client_count: int = 1,
        client_index: int = 0,
    ) -> None:
        self.current_wave = 0
        super().__init__(
            vllm_config, executor_class, log_stats, client_addresses, client_count, client_index
        )
        # [waiting, running, kv_cache_usage] per engine (DPLBAsyncMPClient's scores).
        self.lb_engines: list[list[int | float]] = [[0, 0, 0.0] for _ in self.core_engines]
        # The "first request while paused" notice goes to the stats task over
        # an inproc pair (the task owns the coordinator socket).
        self.first_req_sock_addr = get_open_zmq_inproc_path()
        self.first_req_send_socket = make_zmq_socket(
            self.ctx, self.first_req_sock_addr, zmq.PAIR, bind=True
        )
        self.resources.first_req_send_socket = self.first_req_send_socket
        try:
            asyncio.get_running_loop()
            self._ensure_stats_update_task()
        except RuntimeError:
            pass  # started by the first call made inside an event loop

    def _ensure_stats_update_task(self) -> None:
        resources = self.resources
        if resources.stats_update_task is not None or self.stats_update_address is None:
            return
        resources.stats_update_task = asyncio.create_task(
            self._run_stats_update(self.stats_update_address), name="DPStatsUpdateTask"
        )

    async def _run_stats_update(self, stats_addr: str) -> None:
        """Follow the coordinator's (counts, wave, running) messages; forward
        this client's first-request notices to it."""
        ctx = self.ctx
        assert isinstance(ctx, zmq.asyncio.Context)
        socket = make_zmq_socket(ctx, stats_addr, zmq.XSUB, bind=False, linger=0)
        first_req_rcv = make_zmq_socket(
            ctx, self.first_req_sock_addr, zmq.PAIR, bind=False, linger=0
        )
        try:
            await socket.send(b"\x01")  # subscribe to everything
            poller = zmq.asyncio.Poller()
            poller.register(socket, zmq.POLLIN)
            poller.register(first_req_rcv, zmq.POLLIN)
            while True:
                events = dict(await poller.poll())
                if first_req_rcv in events:
                    target_eng_index = msgspec.msgpack.decode(await first_req_rcv.recv())
                    self.engines_running = True
                    await socket.send(msgspec.msgpack.encode((target_eng_index, self.current_wave)))
                if socket in events:
                    self._apply_stats(await _drain_latest(socket))
        finally:
            socket.close(linger=0)
            first_req_rcv.close(linger=0)

    def _apply_stats(self, buf: bytes | None) -> None:
        if buf is None:
            return
        counts, wave, running = msgspec.msgpack.decode(buf)
        self.current_wave = wave
        self.engines_running = running
        if counts is not None:
            # The coordinator counts every engine; keep the ones this client manages.
            ranks = self.engine_ranks_managed
            self.lb_engines = counts[ranks[0] : ranks[-1] + 1]

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        self._ensure_stats_update_task()
        request.current_wave = self.current_wave
        request.client_index = self.client_index
        chosen_engine = self.get_core_engine_for_request(request)
        to_await = self._send_input(EngineCoreRequestType.ADD, request, chosen_engine)
        if not self.engines_running:
            # Wake the other engines (MoE waves); the coordinator ignores it otherwise.
            index = int.from_bytes(chosen_engine, "little")
            await _async(self.first_req_send_socket).send(msgspec.msgpack.encode(index))
        await to_await

    def get_core_engine_for_request(self, request: EngineCoreRequest) -> EngineIdentity:
        if (rank := request.data_parallel_rank) is not None:
            return rank.to_bytes(2, "little")
        return self.core_engine


class DPLBAsyncMPClient(DPAsyncMPClient):
    """Asyncio client that balances requests over several engine cores."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        executor_class: type[Executor],
        log_stats: bool,
        client_addresses: dict[str, Any] | None = None,
        client_count: int = 1,
        client_index: int = 0,
    ) -> None:
        # Which engine each in-flight request went to (aborts), and how many
        # each engine has from this client.
        self.reqs_in_flight: dict[str, EngineIdentity] = {}
        self.engine_inflight: Counter[EngineIdentity] = Counter()
        super().__init__(
            vllm_config, executor_class, log_stats, client_addresses, client_count, client_index
        )
        assert len(self.core_engines) > 1
        self.eng_start_index = (len(self.core_engines) * self.client_index) // client_count

    def _make_outputs_hook(self) -> Callable[[EngineCoreOutputs], None]:
        """Requests an engine finished no longer count against it."""
        reqs_in_flight, engine_inflight = self.reqs_in_flight, self.engine_inflight

        def on_outputs(outputs: EngineCoreOutputs) -> None:
            for req_id in outputs.finished_requests or ():
                if (engine := reqs_in_flight.pop(req_id, None)) is not None:
                    engine_inflight[engine] -= 1

        return on_outputs

    def get_core_engine_for_request(self, request: EngineCoreRequest) -> EngineIdentity:
        if (eng_index := request.data_parallel_rank) is None:
            eng_index = self._least_loaded_engine()
        chosen_engine = self.core_engines[eng_index]
        self.reqs_in_flight[request.request_id] = chosen_engine
        self.engine_inflight[chosen_engine] += 1
        return chosen_engine

    def _least_loaded_engine(self) -> int:
        """Upstream's score: the larger of the coordinator's (waiting +
        running) and this client's in-flight count (x clients), plus a
        penalty for waiting requests on an engine whose KV cache is over half
        full. Ties rotate, starting from this client's index."""
        current_counts = self.lb_engines
        num_engines = len(current_counts)
        min_score: float = sys.maxsize
        eng_index = 0
        for i in range(num_engines):
            idx = (self.eng_start_index + i) % num_engines
            waiting, running, kv_cache_usage = current_counts[idx]
            inflight = self.engine_inflight[self.core_engines[idx]]
            score: float = max(self.client_count * inflight, waiting + running)
            if waiting:
                score += waiting * 6.0 * max(0.0, kv_cache_usage - 0.5)
            if score < min_score:
                min_score, eng_index = score, idx
        # Count it as waiting until the coordinator's next update.
        current_counts[eng_index][0] += self.client_count
        self.eng_start_index = (self.eng_start_index + 1) % num_engines
        return eng_index

    async def call_utility_async(self, method: str, *args: Any) -> Any:
        """Every engine runs the call; the first engine's result is returned."""
        results = await asyncio.gather(
            *[self._call_utility_on(engine, method, *args) for engine in self.core_engines]
        )
        return results[0]

    async def _call_utility_on(self, engine: EngineIdentity, method: str, *args: Any) -> Any:
        call_id = self._new_call_id()
        future = asyncio.get_running_loop().create_future()
        self.utility_results[call_id] = future
        payload = (self.client_index, call_id, method, args)
        await self._send_input(EngineCoreRequestType.UTILITY, payload, engine)
        return await future

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        if not request_ids or self.resources.engine_dead:
            return
        by_engine: defaultdict[EngineIdentity, list[str]] = defaultdict(list)
        for req_id in request_ids:
            if engine := self.reqs_in_flight.get(req_id):
                by_engine[engine].append(req_id)
        for engine, req_ids in by_engine.items():
            await self._send_input(EngineCoreRequestType.ABORT, req_ids, engine)


async def _drain_latest(socket: zmq.asyncio.Socket) -> bytes | None:
    """The last message waiting on `socket` (only the latest stats matter)."""
    buf = None
    while True:
        try:
            buf = await socket.recv(flags=zmq.NOBLOCK)
        except zmq.Again:
            return buf


def _async(socket: zmq.Socket[Any]) -> zmq.asyncio.Socket:
    assert isinstance(socket, zmq.asyncio.Socket)
    return socket
