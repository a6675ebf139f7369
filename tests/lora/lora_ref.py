"""Dense per-token float64 reference for the multi-LoRA ops and stacked
random adapters, shared by the op and Punica wrapper tests."""

from __future__ import annotations

import torch


def stacked(num_loras: int, rows: int, cols: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """`[num_loras, 1, rows, cols]` random weights (upstream's stacked layout)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(num_loras, 1, rows, cols, generator=g) / cols**0.5).to(dtype)


def ref_shrink(x: torch.Tensor, a: torch.Tensor, slots: list[int], scale: float) -> torch.Tensor:
    """out[t] = scale * x[t] @ A[slot].T in float64; 0 rows for slot -1."""
    out = torch.zeros(x.size(0), a.size(-2), dtype=torch.float64)
    for t, s in enumerate(slots):
        if s >= 0:
            out[t] = scale * (x[t].double() @ a[s].reshape(a.size(-2), -1).double().t())
    return out


def ref_lora(
    y: torch.Tensor,
    x: torch.Tensor,
    a_list: list[torch.Tensor],
    b_list: list[torch.Tensor],
    slots: list[int],
    scale: float,
    offset: int = 0,
) -> torch.Tensor:
    """y (float64 copy) + scale * (x @ A_i^T) @ B_i^T per token, slices side by
    side from `offset`; tokens with slot -1 untouched."""
    out = y.double().clone()
    for t, s in enumerate(slots):
        if s < 0:
            continue
        off = offset
        for a, b in zip(a_list, b_list):
            aw = a[s].reshape(a.size(-2), -1).double()
            bw = b[s].reshape(b.size(-2), -1).double()
            out[t, off : off + bw.size(0)] += scale * (x[t].double() @ aw.t()) @ bw.t()
            off += bw.size(0)
    return out


# Tolerances (max abs error vs the float64 reference, values of order 1):
# float32 accumulates in float32; bfloat16 rounds inputs, weights and the
# output (8 bits of mantissa: ~0.4% relative per rounding).
TOL = {torch.float32: 1e-4, torch.bfloat16: 6e-2}
