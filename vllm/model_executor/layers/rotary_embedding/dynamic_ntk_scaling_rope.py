"""Dynamic NTK-aware RoPE scaling (upstream: dynamic_ntk_scaling_rope.py).

The base is enlarged so the lowest frequency stretches over the longer context
(u/bloc97, u/emozilla): base' = base * (factor * L / L0 - (factor - 1))^(d / (d - 2)).

transformers' `_compute_dynamic_ntk_parameters` evaluates this per forward
with L = the current sequence length (and the plain base while L <= L0), so its
frequencies change with the length. As upstream vLLM, the table here is
computed ONCE with L = L0 * factor (the longest context) and covers that many
positions: it equals transformers' frequencies at seq_len = L0 * factor (the
state transformers reaches once a sequence has grown to that length), not at
shorter lengths. A fixed table keeps cached keys valid across steps.
"""

from __future__ import annotations

import torch

from .base import RotaryEmbedding, cos_sin_table


class DynamicNTKScalingRotaryEmbedding(RotaryEmbedding):
    def __init__(
        self,
        head_size: int,
        rotary_dim: int,
        max_position_embeddings: int,
        base: float,
        is_neox_style: bool,
        scaling_factor: float,
        dtype: torch.dtype,
    ) -> None:
        self.scaling_factor = scaling_factor
        super().__init__(head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype)

    def _compute_cos_sin_cache(self) -> torch.Tensor:
        factor = self.scaling_factor
        max_len = self.max_position_embeddings * factor
        dim = self.rotary_dim
        base = self.base * ((factor * max_len / self.max_position_embeddings) - (factor - 1)) ** (
            dim / (dim - 2)
        )
        return cos_sin_table(self._compute_inv_freq(base), int(max_len))
