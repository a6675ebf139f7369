"""What happens to a request's pooled row (upstream:
vllm/model_executor/layers/pooler/seqwise/heads.py): an embedding head
(projector, Matryoshka truncation, normalisation) or a classifier head
(score layer, logit bias, softmax / sigmoid), per request's PoolingParams.

The row operations are common.py's EmbeddingHeadOps / ClassifierHeadOps
(shared with the token-wise heads); here the ready rows of a step are
stacked so the projector / classifier runs once over them."""

from __future__ import annotations

from collections.abc import Set

import torch

from vllm.model_executor.layers.pooler.common import ClassifierHeadOps, EmbeddingHeadOps, HeadOps
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


class SequencePoolerHead(HeadOps):
    """Stacks the ready rows ([hidden] each; None for a request mid-prefill),
    `project`s them as one block, then `finish`es each per its params."""

    def forward(
        self, pooled_data: list[torch.Tensor | None], pooling_metadata: PoolingMetadata
    ) -> HeadOutput:
        ready, data = _stack_ready(pooled_data, self.head_dtype)
        out: HeadOutput = [None] * len(pooled_data)
        if data is None:
            return out
        data = self.project(data)
        for j, i in enumerate(ready):
            out[i] = self.finish(data[j], pooling_metadata.pooling_params[i])
        return out


class EmbeddingPoolerHead(EmbeddingHeadOps, SequencePoolerHead):
    def get_supported_tasks(self) -> Set[PoolingTask]:
        return {"embed"}


class ClassifierPoolerHead(ClassifierHeadOps, SequencePoolerHead):
    def get_supported_tasks(self) -> Set[PoolingTask]:
        return {"classify"}
