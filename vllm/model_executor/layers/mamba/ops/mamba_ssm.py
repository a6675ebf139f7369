"""Mamba-1 selective scan (upstream: vllm/model_executor/layers/mamba/ops/mamba_ssm.py).

Per channel d and state index n, with the step size dt already softplus-ed:
    h_t = exp(dt_t A) h_{t-1} + dt_t B_t u_t           h [D, N]
    y_t = (h_t C_t + D u_t) * silu(z_t)
States are kept in float32 whatever the input dtype.

`selective_scan_ref` is the token-by-token loop for one sequence (the
reference the tests hold the fast paths to); `selective_scan_fn` is the
chunked two-level scan over a padded batch (16 serial steps per 64-token
block, each over every sequence and chunk at once: about the work of the
plain loop, without its per-token, per-sequence Python steps);
`selective_state_update` is the one-token (decode) step over a batch.

Why not the [T, T] segment-sum form of Mamba-2: Mamba-1's decay differs per
(d, n), so that form builds a [G, D, N, T, T] tensor per chunk; on CPU it
measured 10-100x slower than this scan at T = 8-32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Tokens per chunk of the two-level scan: a block of L tokens takes
# chunk_size + L / chunk_size serial steps (8 + 8 for a full block).
SCAN_CHUNK_SIZE = 8
# Tokens scanned at once. The [G, block, D, N] float32 temporaries scale with
# it; on CPU, blocks much larger than 64 tokens fall out of cache and run
# slower (measured 5x at 512 tokens for D = 1536, N = 16).
SCAN_BLOCK_TOKENS = 64


def _output(
    y: torch.Tensor, u: torch.Tensor, d: torch.Tensor | None, z: torch.Tensor | None
) -> torch.Tensor:
    if d is not None:
        y = y + u.float() * d.float()
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(u.dtype)


def selective_scan_ref(
    u: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    h0: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence, token by token: u, dt, z [L, D], a [D, N], b, c [L, N],
    h0 [D, N] or None (zeros) -> (y [L, D], final state [D, N] float32)."""
    h = h0.float() if h0 is not None else u.new_zeros(a.shape, dtype=torch.float32)
    dt = dt.float()
    decay = torch.exp(dt[:, :, None] * a.float())  # [L, D, N]
    drive = dt[:, :, None] * b.float()[:, None, :] * u.float()[:, :, None]  # [L, D, N]
    ys = []
    for t in range(u.shape[0]):
        h = decay[t] * h + drive[t]
        ys.append(h @ c[t].float())  # [D]
    y = torch.stack(ys) if ys else u.new_zeros(u.shape, dtype=torch.float32)
    return _output(y, u, d, z), h


def _scan_block(
    decay: torch.Tensor, drive: torch.Tensor, c: torch.Tensor, h: torch.Tensor, chunk_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """decay (exp(dt A)), drive [G, L, D, N] (L a multiple of chunk_size), c [G, L, N],
    h [G, D, N] entering -> (y [G, L, D] without the D/z terms, h leaving).

    Two levels, each a short serial loop over large batched tensors:
    1. every chunk from a zero state, all chunks of all sequences at once:
       local_t = a_t local_{t-1} + drive_t (chunk_size steps);
    2. the states at chunk boundaries, chunk after chunk (L / chunk_size steps):
       H_c = P_c H_{c-1} + local_c[last], P_c the chunk's decay product;
    then h_t = P_{<=t} H_{chunk start} + local_t for every token at once, P_{<=t}
    the in-chunk decay product (built in step 1: all factors are <= 1)."""
    g, length, d, n = decay.shape
    nc, t = length // chunk_size, chunk_size
    drive = drive.view(g, nc, t, d, n)
    decay = decay.view(g, nc, t, d, n)
    local = torch.empty_like(drive)  # in-chunk state from zeros
    prod = torch.empty_like(decay)  # in-chunk decay product up to each token
    acc, cum = drive[:, :, 0].clone(), decay[:, :, 0].clone()
    local[:, :, 0], prod[:, :, 0] = acc, cum
    for i in range(1, t):
        acc = torch.addcmul(drive[:, :, i], decay[:, :, i], acc)
        cum = cum * decay[:, :, i]
        local[:, :, i], prod[:, :, i] = acc, cum
    starts = []
    for ci in range(nc):
        starts.append(h)
        h = torch.addcmul(local[:, ci, -1], prod[:, ci, -1], h)
    hs = torch.addcmul(local, prod, torch.stack(starts, dim=1)[:, :, None])
    y = torch.einsum("gtdn,gtn->gtd", hs.view(g, length, d, n), c)
    return y, h


def selective_scan_fn(
    u: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    h0: torch.Tensor | None = None,
    chunk_size: int = SCAN_CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched chunked scan: u, dt, z [G, L, D], a [D, N], b, c [G, L, N],
    h0 [G, D, N] or None -> (y [G, L, D], final state [G, D, N] float32).
    Padding positions must have dt = 0: the state then passes them unchanged.
    Blocks of SCAN_BLOCK_TOKENS bound the [G, block, D, N] temporaries."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}.")
    g, length, _ = u.shape
    af = a.float()
    h = h0.float() if h0 is not None else u.new_zeros(g, *a.shape, dtype=torch.float32)
    ys = []
    for s in range(0, length, SCAN_BLOCK_TOKENS):
        e = min(s + SCAN_BLOCK_TOKENS, length)
        pad = -(e - s) % chunk_size  # dt = 0 padding: decay 1, drive 0
        dtc = F.pad(dt[:, s:e].float(), (0, 0, 0, pad))  # [G, T, D]
        uc = F.pad(u[:, s:e].float(), (0, 0, 0, pad))
        bc = F.pad(b[:, s:e].float(), (0, 0, 0, pad))
        cc = F.pad(c[:, s:e].float(), (0, 0, 0, pad))
        decay = torch.exp(dtc[..., None] * af)  # [G, T, D, N]
        drive = (dtc * uc)[..., None] * bc[:, :, None, :]
        y, h = _scan_block(decay, drive, cc, h, chunk_size)
        ys.append(y[:, : e - s])
    y = torch.cat(ys, dim=1) if ys else u.new_zeros(u.shape, dtype=torch.float32)
    return _output(y, u, d, z), h


def selective_state_update(
    state: torch.Tensor,
    u: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: state [G, D, N], u, dt, z [G, D], b, c [G, N]
    -> (y [G, D], new state [G, D, N] float32)."""
    dtf = dt.float()
    h = (
        torch.exp(dtf[..., None] * a.float()) * state.float()
        + (dtf * u.float())[..., None] * b.float()[:, None, :]
    )
    y = torch.einsum("gdn,gn->gd", h, c.float())
    return _output(y, u, d, z), h
