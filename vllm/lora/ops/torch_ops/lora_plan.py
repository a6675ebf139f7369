"""Per-step execution plan for the grouped PyTorch LoRA ops (CPU).

The slot of every token is fixed for a whole model step, but each LoRA layer
runs a shrink and an expand per output slice (7 projections x layers per
step). `make_plan` therefore decides ONCE per step how the token rows map to
adapter slots, and the functions here reuse that decision in every layer:

- "dense" plan, for decode-like steps (short runs of one slot, or few tokens)
  over a small span of slots `[lo, hi)`: every token is multiplied by the A
  weights of all k = hi - lo slots in ONE matmul (A[lo:hi] viewed as
  `[k * rank, in]`, no copy; with several slices and every slot in the span,
  one matmul for all slices, see `plan_linear`'s a_cat), the `[T, k * rank]`
  result is masked by the one-hot of each token's slot (rows of slot -1
  become 0), and one matmul with B laid out as `[k * rank, out]` adds the
  delta. k times the LoRA flops (small: rank << hidden) but 3 ops per slice,
  where at decode sizes each op costs more in fixed overhead than in flops.
- "rows" plan: a list of (slot, rows) items. When the adapted tokens form
  few runs of one slot (a prefill batch sorted by adapter), one item per run
  whose rows are a plain slice: one matmul each, no gather. Else (long runs
  over many requests, adapters interleaved) one item per slot with its token
  rows as an index tensor: one gather of x per item, shared by all slices,
  and one `index_add_` back.

Arithmetic runs in the LoRA weights' dtype (the activation is cast to it
once), as the Triton kernels, which accumulate in float32 and round the
intermediate to the weight dtype before the expand.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# One item's token rows: a slice (contiguous rows) or an index tensor.
Rows = slice | torch.Tensor

# The dense plan is used when the runs of one slot average fewer tokens than
# this, or the step has at most DENSE_MAX_TOKENS tokens (if its span is small).
MIN_MEAN_RUN = 16
DENSE_MAX_TOKENS = 256
# A "rows" plan takes one slice per run while the runs are at most this many
# per slot in use; else it gathers each slot's rows.
MAX_RUNS_PER_SLOT = 2
# The dense plan multiplies by every slot in [lo, hi): allowed while that span
# holds at most this many slots beyond the ones in use.
MAX_DENSE_WASTE = 4


@dataclass
class LoRAPlan:
    """How one step's tokens map to slots (see the module docstring)."""

    num_tokens: int
    # "rows" plan: (slot, rows) per item, slot >= 0; empty = no adapter used.
    items: list[tuple[int, Rows]] = field(default_factory=list)
    # "dense" plan: slot span [lo, hi) and the per-token one-hot float32
    # mask `[num_tokens, hi - lo]` (all-zero rows for slot -1).
    dense: bool = False
    lo: int = 0
    hi: int = 0
    mask: torch.Tensor | None = None
    indices: torch.Tensor | None = None
    _masks: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)

    @property
    def no_lora(self) -> bool:
        return not self.dense and not self.items

    def mask_as(self, dtype: torch.dtype) -> torch.Tensor:
        """The dense mask in `dtype` (converted once per step and dtype)."""
        assert self.mask is not None
        if dtype not in self._masks:
            self._masks[dtype] = self.mask.to(dtype)
        return self._masks[dtype]


def make_plan(indices: torch.Tensor) -> LoRAPlan:
    """The plan for per-token slots `indices` (-1 = no adapter)."""
    n = indices.numel()
    plan = LoRAPlan(n)
    if n == 0:
        return plan
    run_slots, run_lens = torch.unique_consecutive(indices, return_counts=True)
    slots, lens = run_slots.tolist(), run_lens.tolist()
    used = sorted({s for s in slots if s >= 0})
    if not used:
        return plan
    lo, hi = used[0], used[-1] + 1
    short = n < MIN_MEAN_RUN * len(slots) or n <= DENSE_MAX_TOKENS
    if short and hi - lo <= len(used) + MAX_DENSE_WASTE:
        plan.dense, plan.lo, plan.hi = True, lo, hi
        rel = indices - lo
        mask = torch.zeros(n, hi - lo, dtype=torch.float32, device=indices.device)
        adapted = indices >= 0
        mask[adapted, rel[adapted]] = 1.0
        plan.mask, plan.indices = mask, indices
        return plan
    if sum(s >= 0 for s in slots) <= MAX_RUNS_PER_SLOT * len(used):
        start = 0
        for slot, length in zip(slots, lens):
            if slot >= 0:
                plan.items.append((slot, slice(start, start + length)))
            start += length
        return plan
    plan.items = group_by_slot(indices)
    return plan


def group_by_slot(indices: torch.Tensor) -> list[tuple[int, Rows]]:
    """(slot, its token rows) for every slot used in `indices` (-1
    excluded), ascending; rows are a slice when contiguous."""
    if indices.numel() == 0:
        return []
    sorted_ids, order = torch.sort(indices, stable=True)
    slots, counts = torch.unique_consecutive(sorted_ids, return_counts=True)
    groups: list[tuple[int, Rows]] = []
    start = 0
    for slot, count in zip(slots.tolist(), counts.tolist()):
        rows = order[start : start + count]
        start += count
        if slot < 0:
            continue
        lo, hi = int(rows[0]), int(rows[-1])
        groups.append((slot, slice(lo, hi + 1) if hi - lo + 1 == count else rows))
    return groups


def take(x: torch.Tensor, rows: Rows) -> torch.Tensor:
    return x[rows] if isinstance(rows, slice) else x.index_select(0, rows)


def slot_weight(weights: torch.Tensor, slot: int) -> torch.Tensor:
    """`[n, k]` weight of one slot of `[L, n, k]` / `[L, 1, n, k]` weights."""
    w = weights[slot]
    return w.squeeze(0) if w.dim() == 3 else w


def span_weight(weights: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """A weights of slots [lo, hi) as one `[(hi - lo) * rank, in]` view."""
    return weights[lo:hi].reshape((hi - lo) * weights.size(-2), weights.size(-1))


def stacked_b_t(weights: torch.Tensor) -> torch.Tensor:
    """B `[L, (1,) out, rank]` -> `[L * rank, out]` (a contiguous copy): row
    `s * rank + j` holds B[s][:, j], the layout the dense expand multiplies."""
    b = weights.reshape(weights.size(0), weights.size(-2), weights.size(-1))
    return b.transpose(1, 2).reshape(-1, b.size(1)).contiguous()


def _add_mm(out: torch.Tensor, m1: torch.Tensor, m2: torch.Tensor) -> None:
    """`out += m1 @ m2` in place (out may be a strided window of the layer
    output, and of another dtype than the LoRA weights)."""
    if out.dtype == m1.dtype:
        out.addmm_(m1, m2)
    else:
        out.add_(torch.mm(m1, m2))


def _rows_items(plan: LoRAPlan) -> list[tuple[int, Rows]]:
    """The plan's items; a dense plan regroups its slots (rare path)."""
    if not plan.dense:
        return plan.items
    assert plan.indices is not None
    return group_by_slot(plan.indices)


def plan_shrink(
    plan: LoRAPlan, x: torch.Tensor, a: torch.Tensor, out: torch.Tensor, scale: float
) -> None:
    """`out[t, :rank] = scale * x[t] @ A[slot(t)].T`, 0 for slot -1.
    x `[T, in]`, a `[L, (1,) rank, in]`, out `[>= T, >= rank]`."""
    n, rank, wdt = plan.num_tokens, a.size(-2), a.dtype
    out = out[:n, :rank]
    if plan.dense:
        k = plan.hi - plan.lo
        every = torch.mm(x.to(wdt), span_weight(a, plan.lo, plan.hi).t()).view(n, k, rank)
        # [T, 1, k] @ [T, k, rank]: each token keeps its own slot's rank-vector.
        mine = torch.bmm(plan.mask_as(wdt).unsqueeze(1), every).squeeze(1)
        if scale != 1.0:
            mine.mul_(scale)
        out.copy_(mine)
        return
    out.zero_()
    for slot, rows in plan.items:
        y = torch.mm(take(x, rows).to(wdt), slot_weight(a, slot).t())
        if scale != 1.0:
            y.mul_(scale)
        if isinstance(rows, slice):
            out[rows] = y
        else:
            out.index_copy_(0, rows, y.to(out.dtype))


def plan_expand(
    plan: LoRAPlan,
    x: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    add_inputs: bool,
    b_t: torch.Tensor | None = None,
) -> None:
    """`out[t] (+)= x[t] @ B[slot(t)][:cols].T`, rows of slot -1 untouched.
    x `[T, >= rank]`, b `[L, (1,) >= cols, rank]`, out `[>= T, cols]` (a
    column window of the layer output); b_t = stacked_b_t(b) if cached."""
    n, cols, rank, wdt = plan.num_tokens, out.size(1), b.size(-1), b.dtype
    out, x = out[:n], x[:n, :rank]
    if plan.dense and add_inputs:
        k = plan.hi - plan.lo
        mask = plan.mask_as(wdt).unsqueeze(2)
        spread = (x.to(wdt).unsqueeze(1) * mask).view(n, k * rank)  # 0 off-slot
        bt = b_t if b_t is not None else stacked_b_t(b)
        _add_mm(out, spread, bt[plan.lo * rank : plan.hi * rank, :cols])
        return
    for slot, rows in _rows_items(plan):
        w = slot_weight(b, slot)[:cols]
        y = torch.mm(take(x, rows).to(wdt), w.t())
        if isinstance(rows, slice):
            if add_inputs:
                out[rows] += y
            else:
                out[rows] = y
        elif add_inputs:
            out.index_add_(0, rows, y.to(out.dtype))
        else:
            out.index_copy_(0, rows, y.to(out.dtype))


def plan_linear(
    plan: LoRAPlan,
    y: torch.Tensor,
    x: torch.Tensor,
    a_stacked: tuple[torch.Tensor, ...],
    b_stacked: tuple[torch.Tensor, ...],
    b_t: tuple[torch.Tensor | None, ...],
    scale: float,
    output_slices: tuple[int, ...],
    a_cat: torch.Tensor | None = None,
    offset: int = 0,
) -> None:
    """`y[t, off_i:off_i+n_i] += scale * (x[t] @ A_i.T) @ B_i.T` per slice i
    (slices side by side from `offset`); the rank-sized intermediate never
    leaves the weights' dtype and is not kept in token order. `a_cat`
    (dense plan spanning every slot only): the slices' A stacked as
    `[slices * slots * rank, in]`, so one matmul shrinks for all slices."""
    if plan.dense:
        _dense_linear(plan, y, x, a_stacked, b_stacked, b_t, scale, output_slices, offset, a_cat)
        return
    total = sum(output_slices)
    window = y[: plan.num_tokens, offset : offset + total]
    for slot, rows in plan.items:
        xr = take(x, rows).to(a_stacked[0].dtype)  # one gather for all slices
        delta = window[rows] if isinstance(rows, slice) else xr.new_empty(xr.size(0), total)
        start = 0
        for a, b, cols in zip(a_stacked, b_stacked, output_slices):
            t = torch.mm(xr, slot_weight(a, slot).t())
            if scale != 1.0:
                t.mul_(scale)
            w = slot_weight(b, slot)[:cols].t()
            if isinstance(rows, slice):
                _add_mm(delta[:, start : start + cols], t.to(b.dtype), w)  # in place in y
            else:
                torch.mm(t.to(b.dtype), w, out=delta[:, start : start + cols])
            start += cols
        if not isinstance(rows, slice):
            window.index_add_(0, rows, delta.to(window.dtype))


def _dense_linear(
    plan: LoRAPlan,
    y: torch.Tensor,
    x: torch.Tensor,
    a_stacked: tuple[torch.Tensor, ...],
    b_stacked: tuple[torch.Tensor, ...],
    b_t: tuple[torch.Tensor | None, ...],
    scale: float,
    output_slices: tuple[int, ...],
    offset: int,
    a_cat: torch.Tensor | None,
) -> None:
    # Few dispatcher calls per slice: at decode sizes each op costs more in
    # fixed overhead than in arithmetic.
    n, lo, hi = plan.num_tokens, plan.lo, plan.hi
    k, off, wdt = hi - lo, offset, a_stacked[0].dtype
    xw = x if x.size(0) == n else x[:n]
    xw = xw if xw.dtype == wdt else xw.to(wdt)
    yw = y if y.size(0) == n else y[:n]
    mask = plan.mask_as(wdt).unsqueeze(2)  # [T, k, 1]
    shrunk = None
    if a_cat is not None:  # [T, slices * k * rank]: all slices in one matmul
        shrunk = torch.mm(xw, a_cat.t())
        shrunk.view(n, len(a_stacked), k, -1).mul_(mask.unsqueeze(1))
        if scale != 1.0:
            shrunk.mul_(scale)
    for i, (a, b, bt, cols) in enumerate(zip(a_stacked, b_stacked, b_t, output_slices)):
        rank, slots = a.size(-2), a.size(0)
        assert b.size(-1) == rank and b.dtype == wdt == a.dtype, "dense plan: A and B differ"
        if shrunk is not None:
            every = shrunk[:, i * k * rank : (i + 1) * k * rank]
        else:
            # [T, k * rank]: every token times every slot's A, then the other
            # slots' (and slot -1 tokens') rank-vectors zeroed by the mask.
            aw = a.view(slots * rank, -1) if k == slots else span_weight(a, lo, hi)
            every = torch.mm(xw, aw.t())
            every.view(n, k, rank).mul_(mask)
            if scale != 1.0:
                every.mul_(scale)
        bt = bt if bt is not None else stacked_b_t(b)
        if k != slots or cols != bt.size(1):
            bt = bt[lo * rank : hi * rank, :cols]
        _add_mm(yw[:, off : off + cols], every, bt)
        off += cols
