"""Token-wise poolers: one output row per prompt token, or per step tag
(upstream: vllm/model_executor/layers/pooler/tokwise/)."""

from .heads import TokenClassifierPoolerHead, TokenEmbeddingPoolerHead, TokenPoolerHead
from .methods import AllPool, StepPool, TokenPoolingMethod, get_tok_pooling_method
from .poolers import TokenPooler, pooler_for_token_classify, pooler_for_token_embed

__all__ = [
    "AllPool",
    "StepPool",
    "TokenClassifierPoolerHead",
    "TokenEmbeddingPoolerHead",
    "TokenPooler",
    "TokenPoolerHead",
    "TokenPoolingMethod",
    "get_tok_pooling_method",
    "pooler_for_token_classify",
    "pooler_for_token_embed",
]
