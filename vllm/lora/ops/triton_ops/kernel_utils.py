"""Shared pieces of the Triton LoRA kernels (upstream:
vllm/lora/ops/triton_ops/kernel_utils.py).

Shrink and expand are one kernel (`lora_tile_kernel`): each program handles
one (row block, column block) tile of one adapter group: group `g` (program
axis 1) is slot `lora_ids[g]`, whose tokens are
`sorted_ids[start[g] : start[g] + count[g]]` (see lora_kernel_metadata.py).
The ops differ only in their host side (which tensors are the input, weight
and output of a launch) and in two knobs: shrink scales the product, expand
may add it to the output.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

from vllm.triton_utils import tl, triton

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def group_rows(
    sorted_ids_ptr,
    num_tokens_per_lora_ptr,
    lora_token_start_loc_ptr,
    group,
    m_offset,
    BLOCK_M: tl.constexpr,
):
    """Token rows of this tile (`rows`) and which of them exist (`mask`)."""
    count = tl.load(num_tokens_per_lora_ptr + group)
    start = tl.load(lora_token_start_loc_ptr + group)
    offs = m_offset + tl.arange(0, BLOCK_M)
    mask = offs < count
    rows = tl.load(sorted_ids_ptr + start + offs, mask=mask, other=0)
    return rows, mask


@triton.jit
def tile_matmul(
    a_ptr,
    a_row_stride,
    a_k_stride,
    rows,
    row_mask,
    b_ptr,
    b_n_stride,
    b_k_stride,
    offs_n,
    n_mask,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    """float32 `a[rows, :K] @ b[offs_n, :K].T` for one tile. `a` is cast to
    `b`'s dtype first (as upstream: the float32 shrink buffer meets bf16 B),
    or with FP32_DOT both go to float32 with IEEE products (float32 weights;
    and under the interpreter, whose bf16 `tl.dot` is wrong)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        a = tl.load(
            a_ptr + rows[:, None] * a_row_stride + offs_k[None, :] * a_k_stride,
            mask=row_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        b = tl.load(
            b_ptr + offs_n[None, :] * b_n_stride + offs_k[:, None] * b_k_stride,
            mask=k_mask[:, None] & n_mask[None, :],
            other=0.0,
        )
        if FP32_DOT:
            # `a` keeps its float32 values here (the interpreter's casts of
            # computed values to bf16 and back are wrong too).
            acc += tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(a.to(b.dtype), b)
    return acc


@triton.jit
def lora_tile_kernel(
    input_ptr,
    lora_ptr,
    out_ptr,
    N,
    K,
    sorted_ids_ptr,
    num_tokens_per_lora_ptr,
    lora_token_start_loc_ptr,
    lora_ids_ptr,
    scaling,
    input_d0_stride,
    input_d1_stride,
    lora_d0_stride,
    lora_d1_stride,
    lora_d2_stride,
    output_d0_stride,
    output_d1_stride,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ADD_INPUTS: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    """`out[rows, :N] (+)= scaling * input[rows, :K] @ lora[slot, :N, :K].T`
    for one tile; input rows are token indices, output rows too."""
    group = tl.program_id(axis=1)
    lora_id = tl.load(lora_ids_ptr + group)
    if lora_id == -1:
        return  # base tokens (or an unused group): nothing to do
    n_blocks = tl.cdiv(N, BLOCK_N)
    pid_m = tl.program_id(axis=0) // n_blocks
    pid_n = tl.program_id(axis=0) % n_blocks
    rows, row_mask = group_rows(
        sorted_ids_ptr,
        num_tokens_per_lora_ptr,
        lora_token_start_loc_ptr,
        group,
        pid_m * BLOCK_M,
        BLOCK_M,
    )
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    acc = tile_matmul(
        input_ptr,
        input_d0_stride,
        input_d1_stride,
        rows,
        row_mask,
        lora_ptr + lora_id * lora_d0_stride,
        lora_d1_stride,
        lora_d2_stride,
        offs_n,
        n_mask,
        K,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
        FP32_DOT,
    )
    acc *= scaling  # exact for expand's 1.0
    out = out_ptr + rows[:, None] * output_d0_stride + offs_n[None, :] * output_d1_stride
    mask = row_mask[:, None] & n_mask[None, :]
    # The sum is formed in float32 and rounded once (upstream's expand rounds
    # the product to the output dtype first, then adds).
    if ADD_INPUTS:
        acc += tl.load(out, mask=mask, other=0.0).to(tl.float32)
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


class GroupMeta(NamedTuple):
    """The metadata a launch reads (as `LoRAKernelMeta.meta_args` returns it,
    less the token mapping and the no-LoRA flag)."""

    sorted_ids: torch.Tensor
    num_tokens_per_lora: torch.Tensor
    lora_token_start_loc: torch.Tensor
    lora_ids: torch.Tensor
    num_active_loras: torch.Tensor


def launch_lora_tiles(
    x: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    meta: GroupMeta,
    blocks: tuple[int, int, int],
    scaling: float = 1.0,
    add_inputs: bool = False,
) -> None:
    """One launch of `lora_tile_kernel`: x `[num_tokens, K]`, w `[max_loras,
    N, K]`, out `[num_tokens, N]` (any strides)."""
    block_m, block_n, block_k = blocks
    n, k = w.size(1), w.size(2)
    grid = (
        triton.cdiv(x.size(0), block_m) * triton.cdiv(n, block_n),
        int(meta.num_active_loras.item()),
    )
    lora_tile_kernel[grid](
        x,
        w,
        out,
        n,
        k,
        meta.sorted_ids,
        meta.num_tokens_per_lora,
        meta.lora_token_start_loc,
        meta.lora_ids,
        float(scaling),
        x.stride(0),
        x.stride(1),
        w.stride(0),
        w.stride(1),
        w.stride(2),
        out.stride(0),
        out.stride(1),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        ADD_INPUTS=add_inputs,
        FP32_DOT=fp32_dot(w),
    )


def stacked_weight(weight: torch.Tensor, k: int, what: str) -> torch.Tensor:
    """A stacked LoRA weight `[max_loras, (1,) n, k]` as `[max_loras, n, k]`
    (a view), refused unless its dtype is supported and its last dim is k."""
    w = weight
    if w.dim() == 4 and w.size(1) == 1:
        w = w[:, 0]
    if w.dim() != 3:
        raise ValueError(f"{what}: stacked LoRA weight has shape {tuple(weight.shape)}")
    if w.dtype not in SUPPORTED_DTYPES or w.size(-1) != k:
        raise ValueError(
            f"{what}: {tuple(w.shape)} {w.dtype}, expected [..., {k}] in {SUPPORTED_DTYPES}"
        )
    return w


def group_meta(
    num_rows: int,
    token_lora_mapping: torch.Tensor,
    token_indices_sorted_by_lora_ids: torch.Tensor,
    num_tokens_per_lora: torch.Tensor,
    lora_token_start_loc: torch.Tensor,
    lora_ids: torch.Tensor,
    num_active_loras: torch.Tensor,
) -> GroupMeta:
    """The ops' metadata arguments, checked against the input's row count."""
    if not token_lora_mapping.size(0) == token_indices_sorted_by_lora_ids.size(0) == num_rows:
        raise ValueError(
            f"{num_rows} input rows but metadata for {token_lora_mapping.size(0)} tokens"
        )
    if lora_ids.size(0) != num_tokens_per_lora.size(0) or (
        lora_token_start_loc.size(0) != lora_ids.size(0) + 1
    ):
        raise ValueError("inconsistent LoRA kernel metadata sizes")
    return GroupMeta(
        token_indices_sorted_by_lora_ids,
        num_tokens_per_lora,
        lora_token_start_loc,
        lora_ids,
        num_active_loras,
    )


def fp32_dot(weight: torch.Tensor) -> bool:
    """Whether a kernel multiplies in float32 (see `tile_matmul`)."""
    return weight.dtype == torch.float32 or os.environ.get("TRITON_INTERPRET") == "1"
