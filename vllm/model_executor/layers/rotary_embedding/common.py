"""Shared RoPE helpers (upstream: rotary_embedding/common.py).

The YaRN helpers follow the YaRN paper (Peng et al., 2023, arXiv:2309.00071,
github.com/jquesnelle/yarn) and compute the same values as transformers'
`_compute_yarn_parameters` (its find_correction_dim / find_correction_range /
linear_ramp_factor / get_mscale).
"""

from __future__ import annotations

import math

import torch


def yarn_find_correction_dim(
    num_rotations: float, dim: int, base: float, max_position_embeddings: int
) -> float:
    """The (fractional) rotary dimension whose wavelength fits `num_rotations`
    times into `max_position_embeddings`: dim * ln(L / (2 pi r)) / (2 ln base)."""
    return (dim * math.log(max_position_embeddings / (num_rotations * 2 * math.pi))) / (
        2 * math.log(base)
    )


def yarn_find_correction_range(
    low_rot: float,
    high_rot: float,
    dim: int,
    base: float,
    max_position_embeddings: int,
    truncate: bool = True,
) -> tuple[float, float]:
    """[low, high] dimension band between pure extrapolation (below low) and
    pure interpolation (above high); floored/ceiled when `truncate`."""
    low = yarn_find_correction_dim(low_rot, dim, base, max_position_embeddings)
    high = yarn_find_correction_dim(high_rot, dim, base, max_position_embeddings)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def yarn_linear_ramp_mask(
    low: float, high: float, dim: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """clamp((i - low) / (high - low), 0, 1) for i < dim (high nudged when equal)."""
    if low == high:
        high += 0.001  # avoid a division by zero
    linear = (torch.arange(dim, dtype=dtype) - low) / (high - low)
    return torch.clamp(linear, 0, 1)


def yarn_get_mscale(scale: float = 1.0, mscale: float = 1.0) -> float:
    """YaRN attention temperature sqrt(1/t) = 0.1 * mscale * ln(s) + 1 (s > 1)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_inv_freq(
    base: float,
    rotary_dim: int,
    scaling_factor: float,
    original_max_position: int,
    beta_fast: float,
    beta_slow: float,
    extrapolation_factor: float = 1.0,
    truncate: bool = True,
) -> torch.Tensor:
    """YaRN "NTK-by-parts" frequencies: high frequencies (short wavelengths) keep
    their original value (extrapolation), low ones are divided by the factor
    (interpolation), with a linear ramp between the correction dimensions."""
    pos_freqs = base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (scaling_factor * pos_freqs)
    low, high = yarn_find_correction_range(
        beta_fast, beta_slow, rotary_dim, base, original_max_position, truncate
    )
    ramp = yarn_linear_ramp_mask(low, high, rotary_dim // 2)
    mask = (1 - ramp) * extrapolation_factor
    return inv_freq_interpolation * (1 - mask) + inv_freq_extrapolation * mask
