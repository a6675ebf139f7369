"""A pooling method plus a head (upstream:
vllm/model_executor/layers/pooler/seqwise/poolers.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

import torch

from vllm.config.pooler import PoolerConfig
from vllm.model_executor.layers.pooler.abstract import MethodHeadPooler
from vllm.model_executor.layers.pooler.activations import (
    PoolerActivation,
    PoolerNormalize,
    resolve_classifier_act_fn,
)
from vllm.model_executor.layers.pooler.common import ClassifierFn
from vllm.v1.pool.metadata import PoolingMetadata

from .heads import ClassifierPoolerHead, EmbeddingPoolerHead, SequencePoolerHead
from .methods import SeqPoolingOutput, SequencePoolingMethod, get_seq_pooling_method

SequencePoolingFn: TypeAlias = Callable[[torch.Tensor, PoolingMetadata], SeqPoolingOutput]


class SequencePooler(MethodHeadPooler):
    """1. pick each request's row (pooling method), 2. post-process it (head)."""

    def __init__(
        self,
        pooling: SequencePoolingMethod | SequencePoolingFn,
        head: SequencePoolerHead,
    ) -> None:
        super().__init__(pooling, head)


def _model_config():  # noqa: ANN202 - ModelConfig, imported lazily
    from vllm.config.vllm import get_current_vllm_config

    model_config = get_current_vllm_config().model_config
    assert model_config is not None
    return model_config


def pooler_for_embed(
    pooler_config: PoolerConfig,
    *,
    pooling: SequencePoolingMethod | SequencePoolingFn | None = None,
) -> SequencePooler:
    """seq_pooling_type's method + normalising embedding head (with the
    sentence-transformers Dense projector when the model dir has one)."""
    from vllm.model_executor.layers.pooler.projector import _load_st_projector

    if pooling is None:
        pooling = get_seq_pooling_method(pooler_config.get_seq_pooling_type())
    model_config = _model_config()
    head = EmbeddingPoolerHead(
        head_dtype=model_config.head_dtype,
        projector=_load_st_projector(model_config),
        activation=PoolerNormalize(),
    )
    return SequencePooler(pooling=pooling, head=head)


def pooler_for_classify(
    pooler_config: PoolerConfig,
    *,
    pooling: SequencePoolingMethod | SequencePoolingFn | None = None,
    classifier: ClassifierFn | None = None,
    act_fn: PoolerActivation | None = None,
) -> SequencePooler:
    """seq_pooling_type's method + classifier head (softmax / sigmoid)."""
    if pooling is None:
        pooling = get_seq_pooling_method(pooler_config.get_seq_pooling_type())
    model_config = _model_config()
    head = ClassifierPoolerHead(
        head_dtype=model_config.head_dtype,
        classifier=classifier,
        logit_mean=pooler_config.logit_mean,
        logit_sigma=pooler_config.logit_sigma,
        activation=resolve_classifier_act_fn(model_config, act_fn),
    )
    return SequencePooler(pooling=pooling, head=head)
