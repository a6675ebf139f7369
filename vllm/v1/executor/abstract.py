"""The executor interface (upstream: vllm/v1/executor/abstract.py).

An executor owns the workers and fans calls out to them with
`collective_rpc(method, args, kwargs)`; the engine core only talks to it.
"""

from __future__ import annotations

import importlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, overload

from vllm.logger import init_logger
from vllm.v1.worker.worker_sleep import SLEEP_TAGS, check_wake_up_tags

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.lora.request import LoRARequest
    from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

logger = init_logger(__name__)

# Backends named by parallel_config.distributed_executor_backend that are
# planned but not built yet.
_UNBUILT_BACKENDS = {
    "external_launcher": "the external-launcher executor",
}


class Executor(ABC):
    """Runs the model on one or more workers."""

    uses_ray: bool = False
    supports_pp: bool = False

    @staticmethod
    def get_class(vllm_config: VllmConfig) -> type[Executor]:
        """The executor class for `parallel_config.distributed_executor_backend`:
        an Executor subclass, "uni", a built-in name, or a qualified class name."""
        parallel_config = vllm_config.parallel_config
        backend = parallel_config.distributed_executor_backend
        if backend is None:
            backend = "uni" if parallel_config.world_size == 1 else "mp"
        if isinstance(backend, type):
            if not issubclass(backend, Executor):
                raise TypeError(
                    f"distributed_executor_backend must be a subclass of Executor; got {backend}."
                )
            return backend
        if backend == "uni":
            if parallel_config.world_size != 1:
                raise ValueError(
                    "The 'uni' executor runs one worker; world size is "
                    f"{parallel_config.world_size}."
                )
            from vllm.v1.executor.uniproc_executor import UniProcExecutor

            return UniProcExecutor
        if backend == "mp":
            from vllm.v1.executor.multiproc_executor import MultiprocExecutor

            return MultiprocExecutor
        if backend == "ray":
            from vllm.v1.executor.ray_executor import RayDistributedExecutor

            return RayDistributedExecutor
        if backend in _UNBUILT_BACKENDS:
            raise ValueError(
                f"distributed_executor_backend={backend!r} needs "
                f"{_UNBUILT_BACKENDS[backend]}, which is not built yet; "
                "use 'mp', 'ray' or (world size 1) 'uni'."
            )
        if isinstance(backend, str) and "." in backend:
            module_name, _, class_name = backend.rpartition(".")
            executor_class = getattr(importlib.import_module(module_name), class_name)
            if not (isinstance(executor_class, type) and issubclass(executor_class, Executor)):
                raise TypeError(f"{backend} is not a subclass of Executor.")
            return executor_class
        raise ValueError(f"Unknown distributed executor backend: {backend!r}.")

    def __init__(self, vllm_config: VllmConfig) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.cache_config = vllm_config.cache_config
        self.scheduler_config = vllm_config.scheduler_config
        self.parallel_config = vllm_config.parallel_config
        self.device_config = vllm_config.device_config
        self.load_config = vllm_config.load_config
        self._init_executor()

    @abstractmethod
    def _init_executor(self) -> None:
        """Create the workers, initialise their devices and load the model."""
        raise NotImplementedError

    def register_failure_callback(self, callback: Callable[[], None]) -> None:  # noqa: B027
        """Have `callback` called if the executor fails asynchronously (a worker
        process dying). Executors whose workers live in this process cannot
        fail that way and ignore it."""

    # ---- KV cache set-up ---------------------------------------------------------
    def initialize_from_config(self, kv_cache_configs: list[KVCacheConfig]) -> None:
        """Allocate each worker's KV cache (one config per worker), then warm up."""
        self.collective_rpc("initialize_from_config", args=(kv_cache_configs,))
        self.collective_rpc("compile_or_warm_up_model")

    def determine_available_memory(self) -> list[int]:
        """Bytes each worker can give to its KV cache."""
        return self.collective_rpc("determine_available_memory")

    def get_kv_cache_specs(self) -> list[dict[str, KVCacheSpec]]:
        """Per worker: layer name -> KV cache spec."""
        return self.collective_rpc("get_kv_cache_spec")

    # ---- RPC ---------------------------------------------------------------------
    @overload
    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        non_block: Literal[False] = False,
    ) -> list[Any]: ...

    @overload
    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        non_block: Literal[True],
    ) -> Future[list[Any]]: ...

    @overload
    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        non_block: bool = False,
    ) -> list[Any] | Future[list[Any]]: ...

    @abstractmethod
    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        non_block: bool = False,
    ) -> list[Any] | Future[list[Any]]:
        """Call `method` on every worker and return their results in rank order.

        `method` is a worker method name, or a callable run as
        `method(worker, *args, **kwargs)`. With `non_block` the result is a
        Future of that list. `timeout` (seconds) bounds the wait where the
        executor can enforce it.
        """
        raise NotImplementedError

    # ---- steps -------------------------------------------------------------------
    @property
    def output_rank(self) -> int:
        """The rank whose output a step returns: the first tensor-parallel
        rank of the last pipeline stage, the one that samples."""
        return self.parallel_config.world_size - self.parallel_config.tensor_parallel_size

    def execute_model(
        self, scheduler_output: SchedulerOutput, non_block: bool = False
    ) -> ModelRunnerOutput | None | Future[ModelRunnerOutput | None]:
        """Forward pass of one step. None means: call `sample_tokens` next."""
        return self._step_rpc("execute_model", scheduler_output, non_block)

    def sample_tokens(
        self, grammar_output: GrammarOutput | None, non_block: bool = False
    ) -> ModelRunnerOutput | None | Future[ModelRunnerOutput | None]:
        """Sample the step's tokens (with the structured-output bitmask, if any)."""
        return self._step_rpc("sample_tokens", grammar_output, non_block)

    def _step_rpc(self, method: str, arg: Any, non_block: bool) -> Any:
        """`method(arg)` on every worker; as upstream's base, the driver's
        (rank 0) reply. Executors whose `collective_rpc` can have only
        `output_rank` reply override this."""
        return _first(self.collective_rpc(method, args=(arg,), non_block=non_block))

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The drafts the runner proposed in the last step (speculative
        decoding, sync scheduling), from the output rank; None if none."""
        return self.collective_rpc("take_draft_token_ids")[self.output_rank]

    @property
    def max_concurrent_batches(self) -> int:
        """Steps the engine core may have in flight (its batch queue size)."""
        return 1

    @classmethod
    def supports_async_scheduling(cls) -> bool:
        """Whether the workers can take step N+1 before N's output is back."""
        return False

    @cached_property  # one RPC, not one per access
    def supported_tasks(self) -> tuple[str, ...]:
        return self.collective_rpc("get_supported_tasks")[0]

    @abstractmethod
    def check_health(self) -> None:
        """Raise if an executor component is unhealthy."""
        raise NotImplementedError

    # ---- sleep mode (Worker.sleep / wake_up on every worker) ---------------------------
    # Tags whose memory the workers gave back: "weights", "kv_cache".
    sleeping_tags: frozenset[str] = frozenset()

    @property
    def is_sleeping(self) -> bool:
        return bool(self.sleeping_tags)

    def sleep(self, level: int = 1) -> None:
        """Every worker gives back its KV cache (level 1) and weights (level 2)."""
        if self.is_sleeping:
            logger.warning("Executor is already sleeping.")
            return
        start = time.perf_counter()
        self.collective_rpc("sleep", kwargs={"level": level})
        self.sleeping_tags = frozenset(SLEEP_TAGS)
        logger.info("It took %.6f seconds to fall asleep.", time.perf_counter() - start)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Every worker takes back the memory of `tags` (None: all of it)."""
        check_wake_up_tags(tags)
        if not self.is_sleeping:
            logger.warning("Executor is not sleeping.")
            return
        start = time.perf_counter()
        self.collective_rpc("wake_up", kwargs={"tags": tags})
        self.sleeping_tags = frozenset() if tags is None else self.sleeping_tags - set(tags)
        logger.info(
            "It took %.6f seconds to wake up tags %s.",
            time.perf_counter() - start,
            tags if tags is not None else list(SLEEP_TAGS),
        )

    # ---- LoRA adapters (the workers' add_lora / remove_lora / pin_lora / list_loras) ----
    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load the adapter on every worker; True when all did."""
        _check_lora_id(lora_request.lora_int_id)
        return all(self.collective_rpc("add_lora", args=(lora_request,)))

    def remove_lora(self, lora_id: int) -> bool:
        _check_lora_id(lora_id)
        return all(self.collective_rpc("remove_lora", args=(lora_id,)))

    def pin_lora(self, lora_id: int) -> bool:
        _check_lora_id(lora_id)
        return all(self.collective_rpc("pin_lora", args=(lora_id,)))

    def list_loras(self) -> set[int]:
        """The adapter ids loaded; every worker holds the same ones."""
        per_worker = [set(ids) for ids in self.collective_rpc("list_loras")]
        if any(ids != per_worker[0] for ids in per_worker):
            raise RuntimeError(f"The workers hold different LoRA adapters: {per_worker}.")
        return per_worker[0]

    def shutdown(self) -> None:
        """Shut the workers down."""
        self.collective_rpc("shutdown")


def _check_lora_id(lora_id: int) -> None:
    if lora_id < 1:
        raise ValueError(f"lora_id must be greater than 0, got {lora_id}.")


def _first(output: list[Any] | Future[list[Any]]) -> Any:
    """The driver worker's result, from a list or from a Future of a list."""
    if not isinstance(output, Future):
        return output[0]
    first: Future[Any] = Future()

    def relay(done: Future[list[Any]]) -> None:
        exc = done.exception()
        if exc is not None:
            first.set_exception(exc)
        else:
            first.set_result(done.result()[0])

    output.add_done_callback(relay)
    return first
