"""The gated delta rule, token by token (upstream:
vllm/model_executor/layers/fla/ops/fused_recurrent.py).

Per value head, with state S [K, V], decay g_t <= 0 (log space), beta_t in (0, 1):
    S = exp(g_t) S
    S = S + k_t (beta_t (v_t - S^T k_t))^T        (the delta rule)
    o_t = S^T (scale q_t)
States are kept in float32 whatever the input dtype.

`recurrent_gated_delta_rule_ref` is the plain loop over one sequence (the
reference the tests hold the fast paths to);
`fused_recurrent_gated_delta_rule` steps a whole batch at once, one
position at a time: with one token per sequence it is the decode step.
"""

from __future__ import annotations

import torch


def _step(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """state [..., H, K, V], q/k [..., H, K], v [..., H, V], g/beta [..., H]."""
    state = state * g.exp()[..., None, None]
    kv_mem = torch.einsum("...hkv,...hk->...hv", state, k)
    delta = (v - kv_mem) * beta[..., None]
    state = state + k[..., :, None] * delta[..., None, :]
    return state, torch.einsum("...hkv,...hk->...hv", state, q)


def _scale(k: torch.Tensor, scale: float | None) -> float:
    return k.shape[-1] ** -0.5 if scale is None else scale


def recurrent_gated_delta_rule_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: q, k [L, H, K], v [L, H, V], g, beta [L, H], initial_state
    [H, K, V] or None -> (o [L, H, V] in v's dtype, final state float32)."""
    h, dk, dv = v.shape[1], k.shape[-1], v.shape[-1]
    state = (
        initial_state.float()
        if initial_state is not None
        else v.new_zeros(h, dk, dv, dtype=torch.float32)
    )
    qf = q.float() * _scale(k, scale)
    outs = []
    for t in range(v.shape[0]):
        state, o = _step(state, qf[t], k[t].float(), v[t].float(), g[t].float(), beta[t].float())
        outs.append(o)
    o = torch.stack(outs) if outs else v.new_zeros(v.shape, dtype=torch.float32)
    return o.to(v.dtype), state


def fused_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched: q, k [G, L, H, K], v [G, L, H, V], g, beta [G, L, H],
    initial_state [G, H, K, V] or None -> (o [G, L, H, V], final state
    [G, H, K, V] float32). Padding positions must have g = 0 and beta = 0."""
    gn, length, h = v.shape[:3]
    state = (
        initial_state.float()
        if initial_state is not None
        else v.new_zeros(gn, h, k.shape[-1], v.shape[-1], dtype=torch.float32)
    )
    qf = q.float() * _scale(k, scale)
    kf, vf, gf, bf = k.float(), v.float(), g.float(), beta.float()
    outs = []
    for t in range(length):
        state, o = _step(state, qf[:, t], kf[:, t], vf[:, t], gf[:, t], bf[:, t])
        outs.append(o)
    o = torch.stack(outs, dim=1) if outs else v.new_zeros(v.shape, dtype=torch.float32)
    return o.to(v.dtype), state
