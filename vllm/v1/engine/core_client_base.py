"""The engine-core client interface, its factory and the in-process client
(upstream: vllm/v1/engine/core_client.py, which re-exports them from here).

    InprocClient   the core runs in the caller's process; get_output() steps it
                   (VLLM_ENABLE_V1_MULTIPROCESSING=0).
    SyncMPClient   the core runs in its own process (EngineCoreProc); requests
                   go over ZMQ, a background thread collects outputs (LLM default).
    AsyncMPClient  the same for asyncio callers (AsyncLLM, the API server).

`EngineCoreClient.make_client` picks one. The multiprocess clients are in
core_client_mp.py; they subclass `EngineCoreClient`, so the factory imports
them lazily (the one import cycle of the clients, listed in .importlinter).
The MP clients bind a ROUTER socket (inputs) and a PULL socket (outputs);
messages are msgpack (vllm/v1/serial_utils.py). If the core process dies,
every pending and later call raises `EngineDeadError`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.v1.engine import EngineCoreOutputs, EngineCoreRequest
from vllm.v1.engine.engine_core import EngineCore

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest
    from vllm.v1.engine.core_client_mp import AsyncMPClient
    from vllm.v1.executor.abstract import Executor

logger = init_logger(__name__)


class EngineCoreClient(ABC):
    """The front end's handle on an engine core, wherever it runs."""

    @staticmethod
    def make_client(
        multiprocess_mode: bool,
        asyncio_mode: bool,
        vllm_config: VllmConfig,
        executor_class: type[Executor],
        log_stats: bool,
    ) -> EngineCoreClient:
        """The client for this caller: async -> AsyncMPClient, sync multiprocess ->
        SyncMPClient, else InprocClient."""
        if asyncio_mode and not multiprocess_mode:
            raise NotImplementedError(
                "Running EngineCore in asyncio without multiprocessing is not currently supported."
            )
        if multiprocess_mode and asyncio_mode:
            return EngineCoreClient.make_async_mp_client(vllm_config, executor_class, log_stats)
        if vllm_config.parallel_config.data_parallel_size > 1:
            # As upstream: data parallelism is served by the asyncio clients.
            raise NotImplementedError(
                "data_parallel_size > 1 (--data-parallel-size) needs the asyncio engine "
                "(AsyncLLM / vllm serve); the synchronous LLMEngine runs one engine core."
            )
        if multiprocess_mode:
            from vllm.v1.engine.core_client_mp import SyncMPClient

            return SyncMPClient(vllm_config, executor_class, log_stats)
        return InprocClient(vllm_config, executor_class, log_stats)

    @staticmethod
    def make_async_mp_client(
        vllm_config: VllmConfig,
        executor_class: type[Executor],
        log_stats: bool,
        client_addresses: dict[str, Any] | None = None,
        client_count: int = 1,
        client_index: int = 0,
    ) -> AsyncMPClient:
        """As upstream: DP > 1 -> DPLBAsyncMPClient (this client balances over
        the engines) or DPAsyncMPClient (external load balancing); else
        AsyncMPClient. `client_addresses`: the sockets of this API server when
        the parent started the engines (--api-server-count)."""
        from vllm.v1.engine.core_client_dp import DPAsyncMPClient, DPLBAsyncMPClient
        from vllm.v1.engine.core_client_mp import AsyncMPClient

        parallel_config = vllm_config.parallel_config
        client_args = (
            vllm_config,
            executor_class,
            log_stats,
            client_addresses,
            client_count,
            client_index,
        )
        if parallel_config.data_parallel_size > 1:
            if parallel_config.data_parallel_external_lb:
                return DPAsyncMPClient(*client_args)
            return DPLBAsyncMPClient(*client_args)
        return AsyncMPClient(*client_args)

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the engine core and release its workers."""

    @abstractmethod
    def get_output(self) -> EngineCoreOutputs:
        """The next outputs of the core (for InprocClient: runs one step)."""

    @abstractmethod
    def add_request(self, request: EngineCoreRequest) -> None:
        """Send a new request to the core."""

    @abstractmethod
    def abort_requests(self, request_ids: list[str]) -> None:
        """Abort requests by internal id."""

    @abstractmethod
    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Drop every cached block; False if blocks are still in use."""

    @abstractmethod
    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Call `method` on every worker and return their results."""

    # Sleep mode (EngineCore.sleep / wake_up / is_sleeping).
    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        raise NotImplementedError(f"{type(self).__name__}: use sleep_async()")

    def wake_up(self, tags: list[str] | None = None) -> None:
        raise NotImplementedError(f"{type(self).__name__}: use wake_up_async()")

    def is_sleeping(self) -> bool:
        raise NotImplementedError(f"{type(self).__name__}: use is_sleeping_async()")

    # LoRA adapters (EngineCore.add_lora / remove_lora / list_loras / pin_lora).
    def add_lora(self, lora_request: LoRARequest) -> bool:
        raise NotImplementedError(f"{type(self).__name__}: use add_lora_async()")

    def remove_lora(self, lora_id: int) -> bool:
        raise NotImplementedError(f"{type(self).__name__}: use remove_lora_async()")

    def list_loras(self) -> set[int]:
        raise NotImplementedError(f"{type(self).__name__}: use list_loras_async()")

    def pin_lora(self, lora_id: int) -> bool:
        raise NotImplementedError(f"{type(self).__name__}: use pin_lora_async()")


class InprocClient(EngineCoreClient):
    """The engine core in the caller's process: `get_output()` runs one step."""

    def __init__(
        self, vllm_config: VllmConfig, executor_class: type[Executor], log_stats: bool
    ) -> None:
        self.engine_core = EngineCore(vllm_config, executor_class, log_stats)

    def get_output(self) -> EngineCoreOutputs:
        stashed = self.engine_core.take_stashed_outputs()
        if stashed:  # made while going to sleep
            return EngineCoreOutputs(outputs=[o for s in stashed for o in s.outputs])
        if self.engine_core.is_sleeping():
            return EngineCoreOutputs()  # nothing is scheduled while asleep
        outputs, _ = self.engine_core.step_fn()
        return (outputs and outputs.get(0)) or EngineCoreOutputs()

    def add_request(self, request: EngineCoreRequest) -> None:
        req, request_wave = self.engine_core.preprocess_add_request(request)
        self.engine_core.add_request(req, request_wave)

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids:
            self.engine_core.abort_requests(request_ids)

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        return self.engine_core.reset_prefix_cache(reset_running_requests)

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        return self.engine_core.collective_rpc(method, timeout, args, kwargs)

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        pending = self.engine_core.sleep(level, mode)
        # In process nothing steps the engine while the caller waits here:
        # LLMEngine.sleep refuses mode "wait" while requests are in flight.
        assert pending is None, "sleep mode 'wait' with requests in flight, in process"

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.engine_core.wake_up(tags)

    def is_sleeping(self) -> bool:
        return self.engine_core.is_sleeping()

    def add_lora(self, lora_request: LoRARequest) -> bool:
        return self.engine_core.add_lora(lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        return self.engine_core.remove_lora(lora_id)

    def list_loras(self) -> set[int]:
        return self.engine_core.list_loras()

    def pin_lora(self, lora_id: int) -> bool:
        return self.engine_core.pin_lora(lora_id)

    def shutdown(self) -> None:
        self.engine_core.shutdown()
