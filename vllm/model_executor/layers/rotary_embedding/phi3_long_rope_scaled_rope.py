"""LongRoPE, Phi-3 / Phi-3.5 (upstream: phi3_long_rope_scaled_rope.py).

Per-dimension rescale factors divide the frequencies: inv_freq = 1 / (f_i *
base^(2i/d)), `short_factor` for contexts within original_max_position_embeddings,
`long_factor` beyond; cos/sin are scaled by sqrt(1 + ln(s) / ln(L0)) with
s = max_position_embeddings / L0 (transformers' `_compute_longrope_parameters`;
an explicit `short_mscale`/`long_mscale` overrides it).

Which set applies: transformers switches per forward on the current sequence
length (seq_len > L0: long). As current upstream, the choice here is made once,
from the engine's max_model_len: long factors whenever max_model_len > L0, so the
keys already in the KV cache never change meaning when a sequence crosses L0
(and no batch mixes both). Prompts longer than L0 therefore match transformers
exactly; shorter ones do when max_model_len <= L0.
"""

from __future__ import annotations

import math

import torch

from .base import RotaryEmbedding, cos_sin_table


def _engine_max_model_len() -> int | None:
    from vllm.config.vllm import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    model_config = getattr(config, "model_config", None) if config is not None else None
    return getattr(model_config, "max_model_len", None)


class Phi3LongRoPEScaledRotaryEmbedding(RotaryEmbedding):
    def __init__(
        self,
        head_size: int,
        rotary_dim: int,
        max_position_embeddings: int,
        original_max_position_embeddings: int,
        base: float,
        is_neox_style: bool,
        dtype: torch.dtype,
        short_factor: list[float],
        long_factor: list[float],
        short_mscale: float | None = None,
        long_mscale: float | None = None,
    ) -> None:
        if not is_neox_style:
            raise ValueError("`Phi3LongRoPEScaledRotaryEmbedding` only supports neox_style.")
        for name, factors in (("short_factor", short_factor), ("long_factor", long_factor)):
            if len(factors) != rotary_dim // 2:
                raise ValueError(
                    f"longrope {name} has {len(factors)} values; rotary_dim {rotary_dim} "
                    f"needs {rotary_dim // 2}."
                )
        self.original_max_position_embeddings = original_max_position_embeddings
        self.short_factor = list(short_factor)
        self.long_factor = list(long_factor)
        scale = max_position_embeddings / original_max_position_embeddings
        default_mscale = (
            1.0
            if scale <= 1.0
            else math.sqrt(1 + math.log(scale) / math.log(original_max_position_embeddings))
        )
        self.short_mscale = default_mscale if short_mscale is None else short_mscale
        self.long_mscale = default_mscale if long_mscale is None else long_mscale
        max_model_len = _engine_max_model_len() or max_position_embeddings
        self.use_long_rope = max_model_len > original_max_position_embeddings
        super().__init__(head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype)

    def _factored_inv_freq(self, rescale_factors: list[float]) -> torch.Tensor:
        factors = torch.tensor(rescale_factors, dtype=torch.float32)
        exponents = torch.arange(0, self.rotary_dim, 2, dtype=torch.int64).float()
        return 1.0 / (factors * self.base ** (exponents / self.rotary_dim))

    def _compute_cos_sin_cache(self) -> torch.Tensor:
        # One table for the whole context with the chosen set (see module doc).
        num_positions = max(self.max_position_embeddings, self.original_max_position_embeddings)
        if self.use_long_rope:
            inv_freq = self._factored_inv_freq(self.long_factor)
            return cos_sin_table(inv_freq, num_positions, self.long_mscale)
        inv_freq = self._factored_inv_freq(self.short_factor)
        return cos_sin_table(inv_freq, num_positions, self.short_mscale)
