"""Rotary position embeddings (upstream: vllm/model_executor/layers/rotary_embedding/).

`get_rope` builds (and shares between layers) the embedding a config's RoPE
parameters ask for: default, linear, llama3, dynamic (NTK), yarn, deepseek_yarn
and longrope (alias "su"). Every class precomputes one float32 cos/sin table at
build time (cast to the model dtype) so a step only gathers rows of it.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import RotaryEmbedding
from .deepseek_scaling_rope import DeepseekScalingRotaryEmbedding
from .dynamic_ntk_scaling_rope import DynamicNTKScalingRotaryEmbedding
from .linear_scaling_rope import LinearScalingRotaryEmbedding
from .llama3_rope import Llama3RotaryEmbedding
from .phi3_long_rope_scaled_rope import (
    Phi3LongRoPEScaledRotaryEmbedding,
    _engine_max_model_len,
)
from .yarn_scaling_rope import YaRNScalingRotaryEmbedding

__all__ = [
    "DeepseekScalingRotaryEmbedding",
    "DynamicNTKScalingRotaryEmbedding",
    "LinearScalingRotaryEmbedding",
    "Llama3RotaryEmbedding",
    "Phi3LongRoPEScaledRotaryEmbedding",
    "RotaryEmbedding",
    "YaRNScalingRotaryEmbedding",
    "get_rope",
    "get_rope_parameters",
    "rope_scaling_type",
]

BUILT_ROPE_TYPES = ("default", "linear", "llama3", "dynamic", "yarn", "deepseek_yarn", "longrope")

_ROPE_DICT: dict[tuple, RotaryEmbedding] = {}
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def rope_scaling_type(rope_scaling: dict[str, Any] | None) -> str:
    """The scaling type of a rope_scaling / rope_parameters dict ("su" is longrope,
    as upstream's config patching maps it)."""
    scaling = rope_scaling or {}
    rope_type = scaling.get("rope_type", scaling.get("type")) or "default"
    return "longrope" if rope_type == "su" else str(rope_type)


def _required(scaling: dict[str, Any], key: str, rope_type: str) -> Any:
    if scaling.get(key) is None:
        raise ValueError(f"rope scaling type {rope_type!r} needs `{key}` in the config.")
    return scaling[key]


def _pick(scaling: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The optional keyword arguments of a class that the config sets."""
    return {k: scaling[k] for k in keys if scaling.get(k) is not None}


def _build_yarn(
    head_size: int,
    rotary_dim: int,
    base: float,
    is_neox_style: bool,
    scaling: dict[str, Any],
    dtype: torch.dtype,
) -> RotaryEmbedding:
    factor = _required(scaling, "factor", "yarn")
    original = _required(scaling, "original_max_position_embeddings", "yarn")
    args = (head_size, rotary_dim, original, base, is_neox_style, factor, dtype)
    if rope_scaling_type(scaling) == "deepseek_yarn" or (
        scaling.get("mscale") and scaling.get("mscale_all_dim")
    ):
        # transformers' yarn takes the mscale / mscale_all_dim ratio when both are set.
        keys = ("extrapolation_factor", "attn_factor", "beta_fast", "beta_slow")
        extra = _pick(scaling, keys + ("mscale", "mscale_all_dim"))
        return DeepseekScalingRotaryEmbedding(*args, **extra)
    extra = _pick(
        scaling,
        ("extrapolation_factor", "attn_factor", "beta_fast", "beta_slow", "truncate"),
    )
    extra["apply_yarn_scaling"] = scaling.get("apply_yarn_scaling", True)
    if scaling.get("attention_factor") is not None:
        # transformers' explicit attention_factor replaces the computed mscale.
        extra["attn_factor"] = scaling["attention_factor"]
        extra["apply_yarn_scaling"] = False
    return YaRNScalingRotaryEmbedding(*args, **extra)


def _build_longrope(
    head_size: int,
    rotary_dim: int,
    max_position: int,
    base: float,
    is_neox_style: bool,
    scaling: dict[str, Any],
    dtype: torch.dtype,
) -> RotaryEmbedding:
    original = _required(scaling, "original_max_position_embeddings", "longrope")
    extra = _pick(scaling, ("short_mscale", "long_mscale"))
    if scaling.get("attention_factor") is not None:
        extra = {"short_mscale": scaling["attention_factor"]} | extra
        extra = {"long_mscale": scaling["attention_factor"]} | extra
    return Phi3LongRoPEScaledRotaryEmbedding(
        head_size,
        rotary_dim,
        max_position,
        original,
        base,
        is_neox_style,
        dtype,
        _required(scaling, "short_factor", "longrope"),
        _required(scaling, "long_factor", "longrope"),
        **extra,
    )


def _build(
    head_size: int,
    rotary_dim: int,
    max_position: int,
    base: float,
    is_neox_style: bool,
    scaling: dict[str, Any],
    dtype: torch.dtype,
) -> RotaryEmbedding:
    rope_type = rope_scaling_type(scaling)
    if rope_type == "default":
        return RotaryEmbedding(head_size, rotary_dim, max_position, base, is_neox_style, dtype)
    if rope_type == "linear":
        factor = _required(scaling, "factor", rope_type)
        return LinearScalingRotaryEmbedding(
            head_size, rotary_dim, max_position, base, is_neox_style, factor, dtype
        )
    if rope_type == "llama3":
        return Llama3RotaryEmbedding(
            head_size,
            rotary_dim,
            max_position,
            base,
            is_neox_style,
            dtype,
            *(_required(scaling, k, rope_type) for k in _LLAMA3_KEYS),
        )
    if rope_type == "dynamic":
        if "alpha" in scaling:
            raise ValueError("dynamic rope scaling with `alpha` (NTK-alpha) is not supported.")
        factor = _required(scaling, "factor", rope_type)
        return DynamicNTKScalingRotaryEmbedding(
            head_size, rotary_dim, max_position, base, is_neox_style, factor, dtype
        )
    if rope_type in ("yarn", "deepseek_yarn"):
        return _build_yarn(head_size, rotary_dim, base, is_neox_style, scaling, dtype)
    if rope_type == "longrope":
        return _build_longrope(
            head_size, rotary_dim, max_position, base, is_neox_style, scaling, dtype
        )
    raise ValueError(
        f"Unsupported rope scaling type {rope_type!r} (built: {', '.join(BUILT_ROPE_TYPES)})."
    )


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def get_rope(
    head_size: int,
    rotary_dim: int,
    max_position: int,
    base: float,
    is_neox_style: bool = True,
    rope_scaling: dict[str, Any] | None = None,
    dtype: torch.dtype | None = None,
    partial_rotary_factor: float = 1.0,
) -> RotaryEmbedding:
    """A (shared) rotary embedding; layers with equal parameters get one instance.

    `max_position` is the config's max_position_embeddings; yarn types take their
    original length from the scaling dict (their table covers original * factor).
    """
    dtype = dtype or torch.get_default_dtype()
    if not 0.0 < partial_rotary_factor <= 1.0:
        raise ValueError(f"partial_rotary_factor={partial_rotary_factor} must be in (0, 1].")
    if partial_rotary_factor < 1.0:
        rotary_dim = int(rotary_dim * partial_rotary_factor)
    scaling = rope_scaling or {}
    scaling_key = tuple(sorted((k, _hashable(v)) for k, v in scaling.items()))
    device = torch.empty(0).device  # the device models are being built on
    # longrope's long/short choice depends on the engine's max_model_len.
    engine_len = _engine_max_model_len() if rope_scaling_type(scaling) == "longrope" else None
    key: tuple = (head_size, rotary_dim, max_position, base, is_neox_style, scaling_key)
    key += (dtype, device, engine_len)
    if key not in _ROPE_DICT:
        _ROPE_DICT[key] = _build(
            head_size, rotary_dim, max_position, base, is_neox_style, scaling, dtype
        )
    return _ROPE_DICT[key]


def get_rope_parameters(config: Any) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from an HF config, old or new style
    (transformers 5 keeps both in `rope_parameters`). Scaling is None for default
    rope. Keys the config keeps outside the dict (Phi-3's
    original_max_position_embeddings) are filled in as transformers'
    `standardize_rope_params` does."""
    params = getattr(config, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        theta = 10000.0
    scaling = dict(params) if params else getattr(config, "rope_scaling", None)
    if not scaling:
        return float(theta), None
    scaling = {k: v for k, v in scaling.items() if k != "rope_theta"}
    rope_type = rope_scaling_type(scaling)
    if rope_type == "default":
        return float(theta), None
    if rope_type in ("llama3", "yarn", "longrope"):
        original = getattr(config, "original_max_position_embeddings", None)
        if original is not None:  # transformers gives the config attribute priority
            scaling["original_max_position_embeddings"] = original
        scaling.setdefault(
            "original_max_position_embeddings", getattr(config, "max_position_embeddings", None)
        )
    return float(theta), scaling
