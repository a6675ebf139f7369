"""Sequence-wise poolers: one output row per request (upstream:
vllm/model_executor/layers/pooler/seqwise/)."""

from .heads import ClassifierPoolerHead, EmbeddingPoolerHead, SequencePoolerHead
from .methods import (
    CLSPool,
    LastPool,
    MeanPool,
    SequencePoolingMethod,
    get_seq_pooling_method,
    split_finished,
)
from .poolers import SequencePooler, SequencePoolingFn, pooler_for_classify, pooler_for_embed

__all__ = [
    "CLSPool",
    "ClassifierPoolerHead",
    "EmbeddingPoolerHead",
    "LastPool",
    "MeanPool",
    "SequencePooler",
    "SequencePoolerHead",
    "SequencePoolingFn",
    "SequencePoolingMethod",
    "get_seq_pooling_method",
    "pooler_for_classify",
    "pooler_for_embed",
    "split_finished",
]
