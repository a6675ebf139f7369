"""The gated delta rule in chunked (WY) form (upstream:
vllm/model_executor/layers/fla/ops/chunk.py), batched PyTorch.

Same recurrence as `fused_recurrent.py`. Within a chunk of T tokens entering
with state S0, let G_t = sum_{j<=t} g_j (cumulative log decay) and define the
new values u_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t). Then
    S_t = exp(G_t) S0 + sum_{i<=t} exp(G_t - G_i) k_i u_i^T,
and substituting S_{t-1} into u_t gives the lower-triangular system
    (I + A) U = diag(beta) V - diag(beta exp(G)) K S0,
    A[t, i] = beta_t exp(G_t - G_i) (k_t . k_i)  for i < t (0 elsewhere),
solved once per chunk (the WY representation: U = U' - W S0 with
U' = (I + A)^-1 diag(beta) V, W = (I + A)^-1 diag(beta exp(G)) K). Outputs
and the state leaving the chunk are then matrix products:
    O = diag(exp(G)) Q S0 + (mask_{i<=t} exp(G_t - G_i) Q K^T) U
    S_T = exp(G_T) S0 + K^T diag(exp(G_T - G)) U.
All exponents are <= 0, so nothing overflows; everything is float32.
"""

from __future__ import annotations

import torch

# Tokens per chunk: the triangular solve is T x T per (sequence, head).
CHUNK_SIZE = 64


def _chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk, heads first: q, k [G, H, T, K], v [G, H, T, V], g, beta
    [G, H, T], state [G, H, K, V] -> (o [G, H, T, V], state leaving it)."""
    t = g.shape[-1]
    cum = torch.cumsum(g, dim=-1)  # G_t
    incl = torch.tril(torch.ones(t, t, dtype=torch.bool, device=g.device))
    diff = (cum[..., :, None] - cum[..., None, :]).masked_fill(~incl, float("-inf"))
    decay = diff.exp()  # [G, H, t, i]: exp(G_t - G_i) for i <= t, else 0
    a = (beta[..., :, None] * decay * (k @ k.transpose(-1, -2))).tril(-1)
    eye = torch.eye(t, dtype=a.dtype, device=a.device)
    rhs = torch.cat((beta[..., None] * v, (beta * cum.exp())[..., None] * k), dim=-1)
    sol = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
    u_prime, w = sol.split([v.shape[-1], k.shape[-1]], dim=-1)
    u = u_prime - w @ state  # [G, H, T, V]
    o = cum.exp()[..., None] * (q @ state) + ((q @ k.transpose(-1, -2)) * decay) @ u
    last = cum[..., -1:]  # G_T
    state = last.exp()[..., None] * state + k.transpose(-1, -2) @ (
        (last - cum).exp()[..., None] * u
    )
    return o, state


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched: q, k [G, L, H, K], v [G, L, H, V], g (log decay, <= 0), beta
    [G, L, H], initial_state [G, H, K, V] or None -> (o [G, L, H, V] in v's
    dtype, final state [G, H, K, V] float32). Padding positions must have
    g = 0 and beta = 0 (then they leave the state as it is)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}.")
    gn, length, h, dk = k.shape
    scale = dk**-0.5 if scale is None else scale
    state = (
        initial_state.float()
        if initial_state is not None
        else v.new_zeros(gn, h, dk, v.shape[-1], dtype=torch.float32)
    )
    # Heads first: [G, H, L, ...].
    qf = (q.float() * scale).transpose(1, 2)
    kf, vf = k.float().transpose(1, 2), v.float().transpose(1, 2)
    gf, bf = g.float().transpose(1, 2), beta.float().transpose(1, 2)
    outs = []
    for s in range(0, length, chunk_size):
        e = s + chunk_size
        o, state = _chunk(
            qf[:, :, s:e], kf[:, :, s:e], vf[:, :, s:e], gf[:, :, s:e], bf[:, :, s:e], state
        )
        outs.append(o)
    o = torch.cat(outs, dim=2) if outs else v.new_zeros(gn, h, 0, v.shape[-1], dtype=torch.float32)
    return o.transpose(1, 2).to(v.dtype), state
