"""The pooler interface (upstream: vllm/model_executor/layers/pooler/abstract.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Set
from typing import Any, TypeAlias

import torch
import torch.nn as nn

from vllm.model_executor.layers.pooler.common import HeadOps, PoolingParamsUpdate
from vllm.tasks import POOLING_TASKS, PoolingTask
from vllm.v1.pool.metadata import PoolingMetadata

# One entry per request: its pooled tensor, or None while it is mid-prefill.
# A pooler may return one stacked tensor when every row is ready.
PoolerOutput: TypeAlias = torch.Tensor | list[torch.Tensor | None]


class Pooler(nn.Module, ABC):
    """The interface required for all poolers used in pooling models."""

    @abstractmethod
    def get_supported_tasks(self) -> Set[PoolingTask]:
        """The pooling tasks this pooler serves."""
        raise NotImplementedError

    def get_pooling_updates(self, task: PoolingTask) -> PoolingParamsUpdate:
        """The updated pooling parameters to use for a supported task."""
        return PoolingParamsUpdate()

    @abstractmethod
    def forward(
        self, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata
    ) -> PoolerOutput:
        raise NotImplementedError


class MethodHeadPooler(Pooler):
    """1. pick each request's rows (the pooling method: a module with its own
    supported tasks and pooling updates, or a bare function), 2. post-process
    them (the head). The sequence-wise and token-wise poolers are these."""

    def __init__(self, pooling: Callable[..., Any], head: HeadOps) -> None:
        super().__init__()
        self.pooling = pooling
        self.head = head

    def extra_repr(self) -> str:
        return f"pooling={type(self.pooling).__name__}, head={type(self.head).__name__}"

    def get_supported_tasks(self) -> Set[PoolingTask]:
        tasks = set(POOLING_TASKS) & set(self.head.get_supported_tasks())
        method_tasks = getattr(self.pooling, "get_supported_tasks", None)
        return tasks & set(method_tasks()) if method_tasks is not None else tasks

    def get_pooling_updates(self, task: PoolingTask) -> PoolingParamsUpdate:
        method_updates = getattr(self.pooling, "get_pooling_updates", None)
        return method_updates(task) if method_updates is not None else PoolingParamsUpdate()

    def forward(
        self, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata
    ) -> PoolerOutput:
        return self.head(self.pooling(hidden_states, pooling_metadata), pooling_metadata)
