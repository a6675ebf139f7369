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
    """The model serves LoRA adapters (vllm/lora/model_manager.py): its linear
    layers, plus the modules named in `embedding_modules` (input embedding,
    LM head), can be wrapped by LoRA layers; `packed_modules_mapping` names
    the parts of each fused layer (qkv_proj -> q/k/v_proj) as peft adapters
    name them. A subclass whose layers do not all run through their forward
    (e.g. MLA's absorbed kv_b_proj) sets `supports_lora = False`."""

    supports_lora: ClassVar[bool] = True
    # Upstream's MoE adapter layouts (not built: experts are no LoRA target).
    is_3d_moe_weight: ClassVar[bool] = False
    is_non_gated_moe: ClassVar[bool] = False
    # Module-name suffix -> upstream's role ("input_embeddings" / "output_embeddings").
    embedding_modules: ClassVar[dict[str, str]] = {}
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {}
    # Module-name prefixes whose adapter tensors are skipped on load (e.g. "mtp.").
    lora_skip_prefixes: ClassVar[list[str]] = []


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
