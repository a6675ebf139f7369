"""What happens to a request's pooled row (upstream:
vllm/model_executor/layers/pooler/seqwise/heads.py): an embedding head
(projector, Matryoshka truncation, normalisation) or a classifier head
(score layer, logit bias, softmax / sigmoid), per request's PoolingParams."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Set

import torch
import torch.nn as nn

from vllm.model_executor.layers.pooler.activations import PoolerActivation, PoolerNormalize
from vllm.model_executor.layers.pooler.common import ClassifierFn, ProjectorFn
from vllm.tasks import PoolingTask
from vllm.v1.pool.metadata import PoolingMetadata

HeadOutput = list[torch.Tensor | None]


def _stack_ready(
    rows: list[torch.Tensor | None], dtype: torch.dtype
) -> tuple[list[int], torch.Tensor | None]:
    """Indices of the ready rows and those rows stacked [n, D] in `dtype`."""
    ready = [i for i, r in enumerate(rows) if r is not None]
    if not ready:
        return ready, None
    return ready, torch.stack([rows[i] for i in ready]).to(dtype)  # type: ignore[misc]


class SequencePoolerHead(nn.Module, ABC):
    @abstractmethod
    def get_supported_tasks(self) -> Set[PoolingTask]:
        raise NotImplementedError

    @abstractmethod
    def forward(
        self, pooled_data: list[torch.Tensor | None], pooling_metadata: PoolingMetadata
    ) -> HeadOutput:
        raise NotImplementedError


class EmbeddingPoolerHead(SequencePoolerHead):
    def __init__(
        self,
        head_dtype: torch.dtype = torch.float32,
        projector: ProjectorFn | None = None,
        activation: PoolerActivation | None = None,
    ) -> None:
        super().__init__()
        self.head_dtype = head_dtype
        self.projector = projector
        self.activation = activation if activation is not None else PoolerNormalize()

    def get_supported_tasks(self) -> Set[PoolingTask]:
        return {"embed"}

    def forward(
        self, pooled_data: list[torch.Tensor | None], pooling_metadata: PoolingMetadata
    ) -> HeadOutput:
        ready, data = _stack_ready(pooled_data, self.head_dtype)
        out: HeadOutput = [None] * len(pooled_data)
        if data is None:
            return out
        if self.projector is not None:
            data = self.projector(data)
        for j, i in enumerate(ready):
            params = pooling_metadata.pooling_params[i]
            row = data[j]
            if params.dimensions is not None:  # Matryoshka: truncate, then normalise
                row = row[: params.dimensions]
            if params.normalize:
                row = self.activation(row)
            out[i] = row
        return out


class ClassifierPoolerHead(SequencePoolerHead):
    def __init__(
        self,
        head_dtype: torch.dtype = torch.float32,
        classifier: ClassifierFn | None = None,
        logit_bias: float | None = None,
        activation: PoolerActivation | None = None,
    ) -> None:
        super().__init__()
        self.head_dtype = head_dtype
        self.classifier = classifier
        self.logit_bias = logit_bias
        self.activation = activation

    def get_supported_tasks(self) -> Set[PoolingTask]:
        return {"classify", "score"}

    def forward(
        self, pooled_data: list[torch.Tensor | None], pooling_metadata: PoolingMetadata
    ) -> HeadOutput:
        ready, data = _stack_ready(pooled_data, self.head_dtype)
        out: HeadOutput = [None] * len(pooled_data)
        if data is None:
            return out
        if self.classifier is not None:
            data = self.classifier(data)
        if self.logit_bias is not None:
            data = data - self.logit_bias
        for j, i in enumerate(ready):
            row = data[j]
            if pooling_metadata.pooling_params[i].use_activation and self.activation is not None:
                row = self.activation(row)
            out[i] = row
        return out
