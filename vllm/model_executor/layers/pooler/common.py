"""Types shared by the poolers, and the row operations their heads share
(upstream: vllm/model_executor/layers/pooler/common.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Set
from dataclasses import dataclass
from enum import IntEnum

import torch
import torch.nn as nn

from vllm.model_executor.layers.pooler.activations import PoolerActivation, PoolerNormalize
from vllm.pooling_params import PoolingParams
from vllm.tasks import PoolingTask

ProjectorFn = Callable[[torch.Tensor], torch.Tensor]
ClassifierFn = Callable[[torch.Tensor], torch.Tensor]
ActivationFn = Callable[[torch.Tensor], torch.Tensor]


class PoolingType(IntEnum):
    """Which hidden states a pooler reads: the last token's, all tokens',
    the first (CLS) token's, the step-tag tokens' (STEP: the rows of the
    prompt tokens equal to `step_tag_id`), or the mean over the prompt."""

    LAST = 0
    ALL = 1
    CLS = 2
    STEP = 3
    MEAN = 4


@dataclass(frozen=True)
class PoolingParamsUpdate:
    """What a pooler needs set on the requests it serves."""

    requires_token_ids: bool = False

    def __or__(self, other: PoolingParamsUpdate) -> PoolingParamsUpdate:
        return PoolingParamsUpdate(
            requires_token_ids=self.requires_token_ids or other.requires_token_ids
        )

    def apply(self, params: PoolingParams) -> None:
        params.requires_token_ids = self.requires_token_ids


# What the sequence-wise heads (one row per request, seqwise/heads.py) and
# the token-wise heads (one row per prompt token, tokwise/heads.py) do to
# pooled data: `project` works on a whole block of rows ([N, hidden] ->
# [N, D]: the head dtype, then the projector or the classifier), `finish` on
# one request's rows, per its PoolingParams. A head class lists
# EmbeddingHeadOps or ClassifierHeadOps first among its bases, then
# SequencePoolerHead / TokenPoolerHead (which say how rows are gathered).


class HeadOps(nn.Module, ABC):
    head_dtype: torch.dtype

    @abstractmethod
    def get_supported_tasks(self) -> Set[PoolingTask]:
        raise NotImplementedError

    @abstractmethod
    def project(self, data: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @abstractmethod
    def finish(self, data: torch.Tensor, params: PoolingParams) -> torch.Tensor:
        raise NotImplementedError


class EmbeddingHeadOps(HeadOps):
    """Embeddings: sentence-transformers projector, then per request
    Matryoshka truncation to `dimensions` and L2 normalisation (`use_activation`)."""

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

    def project(self, data: torch.Tensor) -> torch.Tensor:
        data = data.to(self.head_dtype)
        return data if self.projector is None else self.projector(data)

    def finish(self, data: torch.Tensor, params: PoolingParams) -> torch.Tensor:
        if params.dimensions is not None:  # Matryoshka: truncate, then normalise
            data = data[..., : params.dimensions]
        return self.activation(data) if params.use_activation else data


class ClassifierHeadOps(HeadOps):
    """Classifiers: the score layer, calibrated as (logit - logit_mean) /
    logit_sigma (Platt scaling; either may be None), then per request the
    activation (softmax / sigmoid) unless `use_activation` is False."""

    def __init__(
        self,
        head_dtype: torch.dtype = torch.float32,
        classifier: ClassifierFn | None = None,
        logit_mean: float | None = None,
        logit_sigma: float | None = None,
        activation: PoolerActivation | None = None,
    ) -> None:
        super().__init__()
        self.head_dtype = head_dtype
        self.classifier = classifier
        self.logit_mean = logit_mean
        self.logit_sigma = logit_sigma
        self.activation = activation

    def project(self, data: torch.Tensor) -> torch.Tensor:
        data = data.to(self.head_dtype)
        if self.classifier is not None:
            data = self.classifier(data)
        if self.logit_mean is not None:
            data = data - self.logit_mean
        if self.logit_sigma is not None:
            data = data / self.logit_sigma
        return data

    def finish(self, data: torch.Tensor, params: PoolingParams) -> torch.Tensor:
        if params.use_activation and self.activation is not None:
            return self.activation(data)
        return data
