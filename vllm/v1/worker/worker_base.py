"""The worker interface the executors drive (upstream: vllm/v1/worker/worker_base.py).

A worker owns one device and its model runner. Executors call its methods by
name through `collective_rpc`, so every method here is part of the RPC surface.
What a worker needs of its model runner: vllm/v1/worker/runner_interface.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import torch.nn as nn

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.lora.request import LoRARequest
    from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec
    from vllm.v1.outputs import AsyncModelRunnerOutput, DraftTokenIds, ModelRunnerOutput

_R = TypeVar("_R")


class WorkerBase:
    """Device-independent part of a worker.

    Lifecycle, driven by the executor and the engine core:
      init_device -> load_model -> get_kv_cache_spec -> determine_available_memory
      -> initialize_from_config -> compile_or_warm_up_model
      -> (execute_model -> sample_tokens)* -> shutdown
    """

    def __init__(
        self,
        vllm_config: VllmConfig,
        local_rank: int,
        rank: int,
        distributed_init_method: str,
        is_driver_worker: bool = False,
    ) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.cache_config = vllm_config.cache_config
        self.scheduler_config = vllm_config.scheduler_config
        self.parallel_config = vllm_config.parallel_config
        self.device_config = vllm_config.device_config
        self.local_rank = local_rank
        self.rank = rank
        self.distributed_init_method = distributed_init_method
        self.is_driver_worker = is_driver_worker

    def init_device(self) -> None:
        """Select and initialise the device; build the model runner."""
        raise NotImplementedError

    def load_model(self) -> None:
        raise NotImplementedError

    def get_model(self) -> nn.Module:
        raise NotImplementedError

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        """layer name -> KV cache spec of every layer that needs a KV cache."""
        raise NotImplementedError

    def determine_available_memory(self) -> int:
        """Bytes this worker can give to the KV cache."""
        raise NotImplementedError

    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> None:
        """Allocate the KV cache described by `kv_cache_config`."""
        raise NotImplementedError

    def compile_or_warm_up_model(self) -> None:
        raise NotImplementedError

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput | None:
        """Run one step's forward pass. None means: call `sample_tokens` next."""
        raise NotImplementedError

    def sample_tokens(
        self, grammar_output: GrammarOutput | None
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput | None:
        """The step's output; with async scheduling one whose host copy lands later."""
        raise NotImplementedError

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The drafts proposed in the last step (speculative decoding), or None."""
        raise NotImplementedError

    def check_health(self) -> None:
        """Raise if the worker is unusable."""

    def sleep(self, level: int = 1) -> None:
        """Give back the KV cache's memory (level 1) and the weights' (level 2)."""
        raise NotImplementedError(f"{type(self).__name__} has no sleep mode.")

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Take back the memory of `tags` ("weights", "kv_cache"; None: both)."""
        raise NotImplementedError(f"{type(self).__name__} has no sleep mode.")

    # ---- LoRA adapters (the executor's add_lora / remove_lora / pin_lora / list_loras) ----
    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load the adapter into the worker's CPU cache (True when loaded)."""
        raise NotImplementedError

    def remove_lora(self, lora_id: int) -> bool:
        raise NotImplementedError

    def pin_lora(self, lora_id: int) -> bool:
        raise NotImplementedError

    def list_loras(self) -> set[int]:
        raise NotImplementedError

    def apply_model(self, fn: Callable[[nn.Module], _R]) -> _R:
        """Run `fn(model)` in the worker (tests and tools inspect the model this way)."""
        return fn(self.get_model())

    def shutdown(self) -> None:
        """Release what the worker holds."""


def run_method(
    obj: Any, method: str | Callable[..., _R], args: tuple, kwargs: dict[str, Any]
) -> Any:
    """Call `method` on `obj`: a method name, or a callable taking `obj` first."""
    if isinstance(method, str):
        try:
            func = getattr(obj, method)
        except AttributeError as e:
            raise NotImplementedError(
                f"Method {method!r} is not implemented by {type(obj).__name__}."
            ) from e
        return func(*args, **kwargs)
    return method(obj, *args, **kwargs)


class WorkerWrapperBase:
    """Holds the worker of one RPC rank, built late from per-rank kwargs, and
    forwards every other attribute to it (upstream: WorkerWrapperBase).

    Executors talk to this wrapper, so methods that take one argument per
    rank (the KV cache configs) pick this rank's entry here.
    """

    def __init__(self, vllm_config: VllmConfig, rpc_rank: int = 0) -> None:
        self.vllm_config = vllm_config
        self.rpc_rank = rpc_rank
        self.worker: WorkerBase | None = None

    def init_worker(self, all_kwargs: list[dict[str, Any]]) -> None:
        from vllm.v1.worker.gpu_worker import Worker

        self.worker = Worker(**all_kwargs[self.rpc_rank])

    def initialize_from_config(self, kv_cache_configs: list[KVCacheConfig]) -> None:
        assert self.worker is not None
        self.worker.initialize_from_config(kv_cache_configs[self.rpc_rank])

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()

    def __getattr__(self, attr: str) -> Any:
        # Only reached for attributes the wrapper itself lacks.
        worker = self.__dict__.get("worker")
        if worker is None:
            raise AttributeError(f"{attr!r}: the worker is not initialised yet")
        return getattr(worker, attr)
