"""Multi-LoRA shrink / expand in PyTorch (upstream:
vllm/lora/ops/torch_ops/lora_ops.py), same names and signatures.

Layouts (as upstream): LoRA A weights are stacked `[max_loras, rank, hidden]`
(or `[max_loras, 1, rank, hidden]`), LoRA B weights `[max_loras, out, rank]`
(or with the extra 1). Token `t` uses adapter slot `indices[t]`; -1 means no
adapter.

- shrink: `out[t, :rank] = scaling * x[t] @ A[indices[t]].T`; rows of tokens
  without an adapter are set to 0 (as the Triton op, which zeroes its output).
- expand: `out[t, off:off+n] (+)= x[t] @ B[indices[t]].T`; rows of tokens
  without an adapter are left untouched.

Unlike upstream's torch ops (one gathered weight matrix per token and an
einsum), the work is grouped by adapter: the token rows of each adapter are
found once (a stable sort of the indices), and each adapter costs one matmul
over its rows (a plain slice when its rows are contiguous, as in a prefill
batch, else `index_select` / `index_copy_`). No Python loop runs per token.
The sgmv variants take upstream's segment metadata (one adapter per run of
tokens) and expand it to per-token indices.
"""

from __future__ import annotations

import torch

from vllm.lora.ops.torch_ops.lora_plan import group_by_slot, slot_weight, take


def _adapter_weight(weights: torch.Tensor, slot: int, dtype: torch.dtype) -> torch.Tensor:
    """`[n, k]` weight of one slot (dropping the optional size-1 dim)."""
    return slot_weight(weights, slot).to(dtype)


def _check_rows(inputs: torch.Tensor, indices: torch.Tensor) -> None:
    if inputs.size(0) != indices.size(0):
        raise ValueError(
            f"inputs have {inputs.size(0)} rows but lora indices have {indices.size(0)}"
        )


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
) -> None:
    """`output[t, :rank] = scaling * inputs[t] @ A[idx[t]].T` (0 for idx -1)."""
    _check_rows(inputs, lora_indices_tensor)
    rank = lora_b_weights.size(-2)
    out = output_tensor[: inputs.size(0), :rank]
    out.zero_()
    dtype = output_tensor.dtype
    for slot, rows in group_by_slot(lora_indices_tensor):
        w = _adapter_weight(lora_b_weights, slot, dtype)
        y = torch.mm(take(inputs, rows).to(dtype), w.t())
        y.mul_(scaling)
        if isinstance(rows, slice):
            out[rows] = y
        else:
            out.index_copy_(0, rows, y)


def _expand_into(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    out: torch.Tensor,
    indices: torch.Tensor,
    add_inputs: bool,
) -> None:
    """Shared body of the expand ops; `out` is the output's column window."""
    _check_rows(inputs, indices)
    dtype = out.dtype
    for slot, rows in group_by_slot(indices):
        w = _adapter_weight(lora_b_weights, slot, dtype)
        y = torch.mm(take(inputs, rows).to(dtype), w[: out.size(1)].t())
        if isinstance(rows, slice):
            if add_inputs:
                out[rows] += y
            else:
                out[rows] = y
        elif add_inputs:
            out.index_add_(0, rows, y)
        else:
            out.index_copy_(0, rows, y)


def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
) -> None:
    """`output[t] (+)= inputs[t] @ B[idx[t]].T` over the columns both have
    (adapter and model may pad differently); idx -1 rows untouched."""
    common = min(lora_b_weights.size(-2), output_tensor.size(1))
    out = output_tensor[: inputs.size(0), :common]
    _expand_into(inputs, lora_b_weights, out, lora_indices_tensor, add_inputs)


def bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    """`output[t, off:off+size] (+)= inputs[t] @ B[idx[t]].T`."""
    if lora_b_weights.size(-2) != slice_size:
        raise ValueError(f"slice_size {slice_size} != lora_b output size {lora_b_weights.size(-2)}")
    out = output_tensor[: inputs.size(0), slice_offset : slice_offset + slice_size]
    _expand_into(inputs, lora_b_weights, out, lora_indices_tensor, add_inputs)


def _explode(lora_indices_tensor: torch.Tensor, seq_len_tensor: torch.Tensor) -> torch.Tensor:
    """Per-segment adapter slots -> per-token slots."""
    return torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)


def sgmv_shrink(
    inputs: torch.Tensor,
    lora_a_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    scaling: float,
) -> None:
    """`bgmv_shrink` over segments: segment i (starting at b_seq_start_loc[i],
    seq_len_tensor[i] tokens) uses slot lora_indices_tensor[i]."""
    indices = _explode(lora_indices_tensor[:batches], seq_len_tensor[:batches])
    bgmv_shrink(inputs, lora_a_weights, output_tensor, indices, scaling)


def sgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    add_inputs: bool = False,
) -> None:
    indices = _explode(lora_indices_tensor[:batches], seq_len_tensor[:batches])
    bgmv_expand(inputs, lora_b_weights, output_tensor, indices, add_inputs)


def sgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = False,
) -> None:
    indices = _explode(lora_indices_tensor[:batches], seq_len_tensor[:batches])
    bgmv_expand_slice(
        inputs, lora_b_weights, output_tensor, indices, slice_offset, slice_size, add_inputs
    )
