"""The default rotary embedding (upstream: rotary_embedding/base.py).

A cos/sin table for every position up to `max_position` is computed once (in
float32, then cast to the model dtype) and shared by all layers with the same
parameters; `forward` looks up the rows of the step's positions and rotates q/k.
"""

from __future__ import annotations

import torch
from torch import nn

from vllm import _custom_ops as ops


def cos_sin_table(inv_freq: torch.Tensor, num_positions: int, mscale: float = 1.0) -> torch.Tensor:
    """[num_positions, 2 * len(inv_freq)] float32: cos(t * f) | sin(t * f), times
    `mscale` (the attention factor transformers applies to its cos/sin)."""
    t = torch.arange(num_positions, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq.float())
    return torch.cat((freqs.cos() * mscale, freqs.sin() * mscale), dim=-1)


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
        # [num_positions, rotary_dim]: cos in the first half, sin in the second.
        cache = self._compute_cos_sin_cache().to(dtype)
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def _compute_inv_freq(self, base: float) -> torch.Tensor:
        """inv_freq[i] = base^(-2i / rotary_dim), i < rotary_dim / 2 (float32)."""
        exponents = torch.arange(0, self.rotary_dim, 2, dtype=torch.int64).float()
        return 1.0 / (base ** (exponents / self.rotary_dim))

    def _compute_cos_sin_cache(self) -> torch.Tensor:
        """float32 [max_position_embeddings, rotary_dim] table; subclasses change
        the frequencies, the number of positions or scale cos/sin (mscale)."""
        inv_freq = self._compute_inv_freq(self.base)
        return cos_sin_table(inv_freq, self.max_position_embeddings)

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
