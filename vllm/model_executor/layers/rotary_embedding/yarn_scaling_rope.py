"""YaRN RoPE scaling (upstream: yarn_scaling_rope.py).

Frequencies as in the YaRN paper (arXiv:2309.00071; common.yarn_inv_freq) and
cos/sin multiplied by the attention temperature mscale = 0.1 ln(factor) + 1
(times `attn_factor`), the same values as transformers' `_compute_yarn_parameters`
and its rotary classes (cos/sin * attention_scaling). `max_position_embeddings`
is the ORIGINAL context length; the table covers original * factor positions.
"""

from __future__ import annotations

import torch

from .base import RotaryEmbedding, cos_sin_table
from .common import yarn_get_mscale, yarn_inv_freq


class YaRNScalingRotaryEmbedding(RotaryEmbedding):
    def __init__(
        self,
        head_size: int,
        rotary_dim: int,
        max_position_embeddings: int,
        base: float,
        is_neox_style: bool,
        scaling_factor: float,
        dtype: torch.dtype,
        *,
        extrapolation_factor: float = 1,
        attn_factor: float = 1,
        beta_fast: float = 32,
        beta_slow: float = 1,
        apply_yarn_scaling: bool = True,
        truncate: bool = True,
    ) -> None:
        self.scaling_factor = scaling_factor
        self.extrapolation_factor = extrapolation_factor
        self.attn_factor = attn_factor
        self.beta_fast = beta_fast
        self.beta_slow = beta_slow
        self.truncate = truncate
        # apply_yarn_scaling=False: `attn_factor` is the whole scale (transformers'
        # explicit `attention_factor`).
        yarn_mscale = yarn_get_mscale(scaling_factor) if apply_yarn_scaling else 1.0
        self.mscale = float(yarn_mscale * attn_factor)
        super().__init__(head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype)

    def _compute_cos_sin_cache(self) -> torch.Tensor:
        inv_freq = yarn_inv_freq(
            self.base,
            self.rotary_dim,
            self.scaling_factor,
            self.max_position_embeddings,
            self.beta_fast,
            self.beta_slow,
            self.extrapolation_factor,
            self.truncate,
        )
        num_positions = int(self.max_position_embeddings * self.scaling_factor)
        return cos_sin_table(inv_freq, num_positions, self.mscale)
