"""Parallelism configuration (upstream: vllm/config/parallel.py)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Protocol

_BACKENDS = ("uni", "mp", "ray", "external_launcher")


class ExecutorClassLike(Protocol):
    """What the config reads of an executor class given as the backend (an
    `Executor` subclass; vllm.config does not import vllm.v1, see .importlinter)."""

    @classmethod
    def supports_async_scheduling(cls) -> bool: ...


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    # None = chosen: uni for world size 1, ray inside a Ray placement group, else mp.
    # Or an Executor subclass (upstream: type[Executor]).
    distributed_executor_backend: str | type[ExecutorClassLike] | None = None

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1.")
        if self.data_parallel_size > 1:
            raise ValueError(
                f"data_parallel_size={self.data_parallel_size} (-dp/--data-parallel-size) is "
                "not built yet: data parallelism (several engine replicas) is not "
                "implemented, and one engine would run. Use -dp 1 (the default), or start "
                "one server per replica behind a load balancer."
            )
        backend = self.distributed_executor_backend
        if isinstance(backend, str) and backend not in _BACKENDS:
            raise ValueError(
                f"Unknown distributed executor backend {backend!r}; choose one of {_BACKENDS}."
            )
        if backend is None:
            self.distributed_executor_backend = self._default_backend()

    def _default_backend(self) -> str:
        """As upstream: uni for one worker; ray when this process already runs
        inside a Ray placement group; else mp (one node)."""
        if self.world_size == 1:
            return "uni"
        if _in_ray_placement_group():
            return "ray"
        return "mp"

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


def _in_ray_placement_group() -> bool:
    """Whether Ray is initialised here and this task runs in a placement group.
    Ray is only consulted when the caller has imported it already."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    from ray.util import get_current_placement_group

    return get_current_placement_group() is not None
