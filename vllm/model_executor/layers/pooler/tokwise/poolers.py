"""ALL pooling: every prompt token's hidden state, through an embedding or
classifier head applied per token (upstream:
vllm/model_executor/layers/pooler/tokwise/). Under chunked prefill the
earlier chunks' states wait in the request's PoolingStates; the output
([prompt_len, D]) comes with the last chunk."""

from __future__ import annotations

from collections.abc import Set

import torch
import torch.nn as nn

from vllm.config.pooler import PoolerConfig
from vllm.model_executor.layers.pooler.abstract import Pooler, PoolerOutput
from vllm.model_executor.layers.pooler.activations import (
    PoolerActivation,
    PoolerNormalize,
    resolve_classifier_act_fn,
)
from vllm.model_executor.layers.pooler.common import ClassifierFn, ProjectorFn
from vllm.model_executor.layers.pooler.seqwise.methods import split_finished
from vllm.model_executor.layers.pooler.seqwise.poolers import _model_config
from vllm.tasks import PoolingTask
from vllm.v1.pool.metadata import PoolingMetadata

TokOutput = list[torch.Tensor | None]


class AllPool(nn.Module):
    def get_supported_tasks(self) -> Set[PoolingTask]:
        return {"token_embed", "token_classify"}

    def forward(self, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata) -> TokOutput:
        return split_finished(hidden_states, pooling_metadata)


class TokenEmbeddingPoolerHead(nn.Module):
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
        return {"token_embed"}

    def forward(self, pooled: TokOutput, pooling_metadata: PoolingMetadata) -> TokOutput:
        out: TokOutput = []
        for data, params in zip(pooled, pooling_metadata.pooling_params):
            if data is None:
                out.append(None)
                continue
            data = data.to(self.head_dtype)
            if self.projector is not None:
                data = self.projector(data)
            if params.dimensions is not None:
                data = data[..., : params.dimensions]
            if params.normalize:
                data = self.activation(data)
            out.append(data)
        return out


class TokenClassifierPoolerHead(nn.Module):
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
        return {"token_classify"}

    def forward(self, pooled: TokOutput, pooling_metadata: PoolingMetadata) -> TokOutput:
        out: TokOutput = []
        for data, params in zip(pooled, pooling_metadata.pooling_params):
            if data is None:
                out.append(None)
                continue
            data = data.to(self.head_dtype)
            if self.classifier is not None:
                data = self.classifier(data)
            if self.logit_bias is not None:
                data = data - self.logit_bias
            if params.use_activation and self.activation is not None:
                data = self.activation(data)
            out.append(data)
        return out


class TokenPooler(Pooler):
    def __init__(
        self, pooling: AllPool, head: TokenEmbeddingPoolerHead | TokenClassifierPoolerHead
    ) -> None:
        super().__init__()
        self.pooling = pooling
        self.head = head

    def get_supported_tasks(self) -> Set[PoolingTask]:
        return set(self.pooling.get_supported_tasks()) & set(self.head.get_supported_tasks())

    def forward(
        self, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata
    ) -> PoolerOutput:
        return self.head(self.pooling(hidden_states, pooling_metadata), pooling_metadata)


def pooler_for_token_embed(pooler_config: PoolerConfig) -> TokenPooler:
    from vllm.model_executor.layers.pooler.projector import _load_st_projector

    model_config = _model_config()
    head = TokenEmbeddingPoolerHead(
        head_dtype=model_config.head_dtype, projector=_load_st_projector(model_config)
    )
    return TokenPooler(AllPool(), head)


def pooler_for_token_classify(
    pooler_config: PoolerConfig,
    *,
    classifier: ClassifierFn | None = None,
    act_fn: PoolerActivation | None = None,
) -> TokenPooler:
    model_config = _model_config()
    head = TokenClassifierPoolerHead(
        head_dtype=model_config.head_dtype,
        classifier=classifier,
        logit_bias=pooler_config.logit_bias,
        activation=resolve_classifier_act_fn(model_config, act_fn),
    )
    return TokenPooler(AllPool(), head)
