"""A token-wise pooling method plus a head applied per token (upstream:
vllm/model_executor/layers/pooler/tokwise/poolers.py). The method is the
pooler config's tok_pooling_type (ALL, or STEP); the output ([rows, D] per
request) comes with the prompt's last chunk."""

from __future__ import annotations

from vllm.config.pooler import PoolerConfig
from vllm.model_executor.layers.pooler.abstract import MethodHeadPooler
from vllm.model_executor.layers.pooler.activations import (
    PoolerActivation,
    resolve_classifier_act_fn,
)
from vllm.model_executor.layers.pooler.common import ClassifierFn
from vllm.model_executor.layers.pooler.seqwise.poolers import _model_config

from .heads import TokenClassifierPoolerHead, TokenEmbeddingPoolerHead, TokenPoolerHead
from .methods import TokenPoolingMethod, get_tok_pooling_method


class TokenPooler(MethodHeadPooler):
    def __init__(self, pooling: TokenPoolingMethod, head: TokenPoolerHead) -> None:
        super().__init__(pooling, head)


def _tok_pooling_method(pooler_config: PoolerConfig) -> TokenPoolingMethod:
    """The configured token pooling: ALL (every token) or STEP."""
    return get_tok_pooling_method(pooler_config.get_tok_pooling_type())


def pooler_for_token_embed(pooler_config: PoolerConfig) -> TokenPooler:
    from vllm.model_executor.layers.pooler.projector import _load_st_projector

    model_config = _model_config()
    head = TokenEmbeddingPoolerHead(
        head_dtype=model_config.head_dtype, projector=_load_st_projector(model_config)
    )
    return TokenPooler(_tok_pooling_method(pooler_config), head)


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
        logit_mean=pooler_config.logit_mean,
        logit_sigma=pooler_config.logit_sigma,
        activation=resolve_classifier_act_fn(model_config, act_fn),
    )
    return TokenPooler(_tok_pooling_method(pooler_config), head)
