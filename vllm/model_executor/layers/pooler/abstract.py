"""The pooler interface (upstream: vllm/model_executor/layers/pooler/abstract.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Set
from typing import TypeAlias

import torch
import torch.nn as nn

from vllm.model_executor.layers.pooler.common import PoolingParamsUpdate
from vllm.tasks import PoolingTask
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
