"""Linear (position interpolation) RoPE scaling (upstream: linear_scaling_rope.py).

Positions are divided by `factor` (kaiokendev's "SuperHOT" / Chen et al. 2023,
arXiv:2306.15595); as transformers' `_compute_linear_scaling_rope_parameters`
this is done on the frequencies (inv_freq / factor, the same angles). The table
covers max_position_embeddings * factor positions.
"""

from __future__ import annotations

import torch

from .base import RotaryEmbedding, cos_sin_table


class LinearScalingRotaryEmbedding(RotaryEmbedding):
    def __init__(
        self,
        head_size: int,
        rotary_dim: int,
        max_position_embeddings: int,
        base: float,
        is_neox_style: bool,
        scaling_factors: float,
        dtype: torch.dtype,
    ) -> None:
        if isinstance(scaling_factors, (list, tuple)):
            # Upstream accepts a list (one table per factor, for LoRA); not built here.
            raise ValueError(
                f"linear rope scaling with a list of factors {scaling_factors!r} is not "
                "supported; give one float `factor`."
            )
        self.scaling_factor = float(scaling_factors)
        super().__init__(head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype)

    def _compute_cos_sin_cache(self) -> torch.Tensor:
        inv_freq = self._compute_inv_freq(self.base) / self.scaling_factor
        return cos_sin_table(inv_freq, int(self.max_position_embeddings * self.scaling_factor))
