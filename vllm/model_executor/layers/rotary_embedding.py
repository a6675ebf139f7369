"""Rotary position embeddings (upstream: vllm/model_executor/layers/rotary_embedding/).

A cos/sin table for every position up to `max_position` is computed once (in
float32, then cast to the model dtype) and shared by all layers with the same
parameters; `forward` looks up the rows of the step's positions and rotates q/k.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from vllm import _custom_ops as ops


def _default_inv_freq(base: float, rotary_dim: int) -> torch.Tensor:
    """inv_freq[i] = base^(-2i / rotary_dim), i < rotary_dim / 2 (float32)."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    return 1.0 / (base**exponents)


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 frequency scaling: long wavelengths are divided by `factor`,
    short ones kept, and the band in between interpolated smoothly."""
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Rotates the first `rotary_dim` channels of each head by position.

    neox style rotates the two halves [x1 | x2] of the rotary channels;
    GPT-J style rotates interleaved pairs (x0, x1), (x2, x3), ...
    """

    cos_sin_cache: torch.Tensor  # a buffer (register_buffer)

    def __init__(
        self,
        head_size: int,
        rotary_dim: int,
        max_position_embeddings: int,
        base: float,
        is_neox_style: bool,
        dtype: torch.dtype,
        rope_scaling: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if rotary_dim > head_size or rotary_dim % 2:
            raise ValueError(f"Invalid rotary_dim {rotary_dim} for head_size {head_size}.")
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.max_position_embeddings = max_position_embeddings
        self.base = base
        self.is_neox_style = is_neox_style
        self.dtype = dtype
        inv_freq, num_positions = self._inv_freq_and_len(rope_scaling)
        t = torch.arange(num_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # [num_positions, rotary_dim / 2]
        cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)
        # [num_positions, rotary_dim]: cos in the first half, sin in the second.
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def _inv_freq_and_len(self, scaling: dict[str, Any] | None) -> tuple[torch.Tensor, int]:
        inv_freq = _default_inv_freq(self.base, self.rotary_dim)
        scaling = scaling or {}
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type == "default":
            return inv_freq, self.max_position_embeddings
        if rope_type == "llama3":
            return _llama3_inv_freq(inv_freq, scaling), self.max_position_embeddings
        if rope_type == "linear":
            factor = scaling["factor"]
            return inv_freq / factor, int(self.max_position_embeddings * factor)
        raise ValueError(
            f"Unsupported rope scaling type {rope_type!r} (built: default, linear, llama3)."
        )

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [T, heads, head_size]; cos/sin [T, 1, rotary_dim / 2]."""
        rot = x[..., : self.rotary_dim]
        if self.is_neox_style:
            x1, x2 = rot.chunk(2, dim=-1)
            rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        else:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
            rotated = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        if self.rotary_dim == self.head_size:
            return rotated
        return torch.cat((rotated, x[..., self.rotary_dim :]), dim=-1)

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """positions [T]; query [T, num_heads * head_size]; key [T, num_kv_heads *
        head_size] -> rotated (query, key) with the input shapes (new tensors)."""
        if (
            ops.has_compiled_ops(query)
            and query.dim() == 2
            and key is not None
            and key.dim() == 2
            and self.cos_sin_cache.dtype == query.dtype
        ):
            # csrc/cpu/pos_encoding.cpp: rotated copies in one pass (the
            # caller's q/k, often views of the qkv projection, are untouched).
            q_out = torch.empty_like(query, memory_format=torch.contiguous_format)
            k_out = torch.empty_like(key, memory_format=torch.contiguous_format)
            ops.rotary_embedding_out(
                positions,
                query,
                key,
                self.head_size,
                self.cos_sin_cache,
                self.is_neox_style,
                q_out,
                k_out,
            )
            return q_out, k_out
        cos_sin = self.cos_sin_cache.index_select(0, positions.flatten())
        cos, sin = cos_sin.unsqueeze(1).chunk(2, dim=-1)  # each [T, 1, rotary_dim / 2]
        num_tokens = positions.numel()
        q = self._rotate(query.view(num_tokens, -1, self.head_size), cos, sin)
        query = q.reshape(query.shape)
        if key is not None:
            k = self._rotate(key.view(num_tokens, -1, self.head_size), cos, sin)
            key = k.reshape(key.shape)
        return query, key

    def extra_repr(self) -> str:
        return (
            f"head_size={self.head_size}, rotary_dim={self.rotary_dim}, "
            f"max_position_embeddings={self.max_position_embeddings}, base={self.base}, "
            f"is_neox_style={self.is_neox_style}"
        )


_ROPE_DICT: dict[tuple, RotaryEmbedding] = {}


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
    """A (shared) rotary embedding; layers with equal parameters get one instance."""
    dtype = dtype or torch.get_default_dtype()
    if partial_rotary_factor < 1.0:
        rotary_dim = int(rotary_dim * partial_rotary_factor)
    scaling_key = tuple(sorted((k, str(v)) for k, v in (rope_scaling or {}).items()))
    device = torch.empty(0).device  # the device models are being built on
    key = (head_size, rotary_dim, max_position, base, is_neox_style, scaling_key, dtype, device)
    if key not in _ROPE_DICT:
        _ROPE_DICT[key] = RotaryEmbedding(
            head_size, rotary_dim, max_position, base, is_neox_style, dtype, rope_scaling
        )
    return _ROPE_DICT[key]


def get_rope_parameters(config: Any) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from an HF config, old or new style
    (transformers 5 keeps both in `rope_parameters`). Scaling is None for default rope."""
    params = getattr(config, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        theta = 10000.0
    scaling = dict(params) if params else getattr(config, "rope_scaling", None)
    if scaling:
        scaling = {k: v for k, v in scaling.items() if k != "rope_theta"}
        if scaling.get("rope_type", scaling.get("type", "default")) == "default":
            scaling = None
    return float(theta), scaling or None
