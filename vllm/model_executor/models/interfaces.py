"""Capability markers a model class declares (upstream:
vllm/model_executor/models/interfaces.py).

A model opts in by inheriting the marker; the registry reads the class
attributes (`supports_pp`, `has_inner_state`, ...) without building the model.
Declare only what the model really implements.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal


class SupportsPP:
    """The model can be split into pipeline-parallel stages
    (`make_empty_intermediate_tensors`, `intermediate_tensors` in forward)."""

    supports_pp: ClassVar[Literal[True]] = True


class SupportsLoRA:
    """The model accepts LoRA adapters on the modules in `packed_modules_mapping`."""

    supports_lora: ClassVar[Literal[True]] = True


class HasInnerState:
    """The model keeps per-request state besides the KV cache (e.g. Mamba)."""

    has_inner_state: ClassVar[Literal[True]] = True


class IsAttentionFree:
    """The model has no attention layers (and so no KV cache)."""

    is_attention_free: ClassVar[Literal[True]] = True


class IsHybrid:
    """The model mixes attention with state-space / linear-attention layers."""

    is_hybrid: ClassVar[Literal[True]] = True


def _flag(model: Any, name: str) -> bool:
    return bool(getattr(model, name, False))


def supports_pp(model: Any) -> bool:
    return _flag(model, "supports_pp")


def supports_lora(model: Any) -> bool:
    return _flag(model, "supports_lora")


def has_inner_state(model: Any) -> bool:
    return _flag(model, "has_inner_state")


def is_attention_free(model: Any) -> bool:
    return _flag(model, "is_attention_free")


def is_hybrid(model: Any) -> bool:
    return _flag(model, "is_hybrid")
