"""Poolers of pooling models (upstream: vllm/model_executor/layers/pooler/).

How a model exposes its pooler: a pooling model class sets
`is_pooling_model = True` and builds `self.pooler`, a `Pooler` (usually a
`DispatchPooler`), from the resolved `vllm_config.model_config.pooler_config`:

    pooler_config = vllm_config.model_config.pooler_config
    self.pooler = DispatchPooler.for_embedding(pooler_config)          # embedders
    self.pooler = DispatchPooler.for_seq_cls(pooler_config,            # classifiers
                                             classifier=self.classifier)

The V1 runner calls `model(...)` for the hidden states of the scheduled
tokens, then `model.pooler(hidden_states, pooling_metadata)`, which returns one
tensor per request (None for a request still mid-prefill).

Layout: abstract.py (the `Pooler` ABC), common.py (PoolingParamsUpdate, type
aliases), activations.py (normalize / softmax / sigmoid), seqwise/ (one row
per sequence: CLS / LAST / MEAN + embedding or classifier head), tokwise/
(one row per token: ALL, or per step tag: STEP), special.py (DispatchPooler).
"""

from .abstract import Pooler, PoolerOutput
from .activations import (
    PoolerActivation,
    PoolerClassify,
    PoolerIdentity,
    PoolerMultiLabelClassify,
    PoolerNormalize,
    resolve_classifier_act_fn,
)
from .common import ActivationFn, ClassifierFn, PoolingParamsUpdate, PoolingType, ProjectorFn
from .special import DispatchPooler

__all__ = [
    "ActivationFn",
    "ClassifierFn",
    "DispatchPooler",
    "Pooler",
    "PoolerActivation",
    "PoolerClassify",
    "PoolerIdentity",
    "PoolerMultiLabelClassify",
    "PoolerNormalize",
    "PoolerOutput",
    "PoolingParamsUpdate",
    "PoolingType",
    "ProjectorFn",
    "resolve_classifier_act_fn",
]
