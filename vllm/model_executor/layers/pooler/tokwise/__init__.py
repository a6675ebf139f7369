"""Token-wise poolers: one output row per prompt token (upstream:
vllm/model_executor/layers/pooler/tokwise/)."""

from .poolers import (
    AllPool,
    TokenClassifierPoolerHead,
    TokenEmbeddingPoolerHead,
    TokenPooler,
    pooler_for_token_classify,
    pooler_for_token_embed,
)

__all__ = [
    "AllPool",
    "TokenClassifierPoolerHead",
    "TokenEmbeddingPoolerHead",
    "TokenPooler",
    "pooler_for_token_classify",
    "pooler_for_token_embed",
]
