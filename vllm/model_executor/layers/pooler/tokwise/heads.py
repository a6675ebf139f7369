"""Token-wise heads (upstream: vllm/model_executor/layers/pooler/tokwise/heads.py):
each finished request's rows [num_rows, hidden] through common.py's
embedding or classifier row operations, per its PoolingParams."""

from __future__ import annotations

from collections.abc import Set

import torch

from vllm.model_executor.layers.pooler.common import ClassifierHeadOps, EmbeddingHeadOps, HeadOps
from vllm.tasks import PoolingTask
from vllm.v1.pool.metadata import PoolingMetadata

TokOutput = list[torch.Tensor | None]


class TokenPoolerHead(HeadOps):
    """One request at a time (its rows are one block); None stays None."""

    def forward(self, pooled: TokOutput, pooling_metadata: PoolingMetadata) -> TokOutput:
        return [
            None if data is None else self.finish(self.project(data), params)
            for data, params in zip(pooled, pooling_metadata.pooling_params)
        ]


class TokenEmbeddingPoolerHead(EmbeddingHeadOps, TokenPoolerHead):
    def get_supported_tasks(self) -> Set[PoolingTask]:
        return {"token_embed"}


class TokenClassifierPoolerHead(ClassifierHeadOps, TokenPoolerHead):
    def get_supported_tasks(self) -> Set[PoolingTask]:
        return {"token_classify"}
