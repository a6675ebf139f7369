"""DeepSeek's YaRN (upstream: deepseek_scaling_rope.py, rope type "deepseek_yarn").

YaRN frequencies (common.yarn_inv_freq) with cos/sin scaled by
mscale(factor, mscale) / mscale(factor, mscale_all_dim) * attn_factor, where
mscale(s, m) = 0.1 m ln(s) + 1. With both keys set (DeepSeek-V2/V3 configs)
this is transformers' yarn attention_factor; transformers ignores a lone
`mscale` (it then uses mscale(factor, 1)), upstream and this class use it.
The attention softmax scale gets mscale(factor, mscale_all_dim)^2 in the model
(deepseek_v2.py), as both upstream and transformers' DeepseekV2Attention do.
`max_position_embeddings` is the original context; the table covers
original * factor positions.
"""

from __future__ import annotations

import torch

from .base import RotaryEmbedding, cos_sin_table
from .common import yarn_get_mscale, yarn_inv_freq


class DeepseekScalingRotaryEmbedding(RotaryEmbedding):
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
        mscale: float = 1,
        mscale_all_dim: float = 0,
    ) -> None:
        self.scaling_factor = scaling_factor
        self.extrapolation_factor = extrapolation_factor
        self.attn_factor = attn_factor
        self.beta_fast = beta_fast
        self.beta_slow = beta_slow
        self.mscale = float(
            yarn_get_mscale(scaling_factor, float(mscale))
            / yarn_get_mscale(scaling_factor, float(mscale_all_dim))
            * attn_factor
        )
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
        )
        num_positions = int(self.max_position_embeddings * self.scaling_factor)
        return cos_sin_table(inv_freq, num_positions, self.mscale)
