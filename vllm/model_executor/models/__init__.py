"""Model definitions, found by architecture name through `ModelRegistry`
(upstream: vllm/model_executor/models/__init__.py)."""

from vllm.model_executor.models.interfaces import (
    HasInnerState,
    IsAttentionFree,
    IsHybrid,
    SupportsLoRA,
    SupportsPP,
    has_inner_state,
    is_attention_free,
    is_hybrid,
    supports_lora,
    supports_pp,
)
from vllm.model_executor.models.registry import ModelRegistry

__all__ = [
    "ModelRegistry",
    "HasInnerState",
    "IsAttentionFree",
    "IsHybrid",
    "SupportsLoRA",
    "SupportsPP",
    "has_inner_state",
    "is_attention_free",
    "is_hybrid",
    "supports_lora",
    "supports_pp",
]
