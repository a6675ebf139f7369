"""Parallelism configuration (upstream: vllm/config/parallel.py)."""
from __future__ import annotations

from dataclasses import dataclass

_BACKENDS = ("uni", "mp", "ray", "external_launcher")


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    # None = chosen from the world size: uni for 1, mp on one node.
    distributed_executor_backend: str | type | None = None

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1.")
        backend = self.distributed_executor_backend
        if isinstance(backend, str) and backend not in _BACKENDS:
            raise ValueError(f"Unknown distributed executor backend {backend!r}; choose one "
                             f"of {_BACKENDS}.")
        if backend is None:
            self.distributed_executor_backend = "uni" if self.world_size == 1 else "mp"

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size
