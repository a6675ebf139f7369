"""Shared pieces of the Triton LoRA kernels (upstream:
vllm/lora/ops/triton_ops/kernel_utils.py).

Each program handles one (row block, column block) tile of one adapter
group: group `g` (program axis 1) is slot `lora_ids[g]`, whose tokens are
`sorted_ids[start[g] : start[g] + count[g]]` (see lora_kernel_metadata.py).
"""

from __future__ import annotations

import os

import torch

from vllm.triton_utils import tl, triton


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


def as_3d(weight: torch.Tensor) -> torch.Tensor:
    """`[max_loras, 1, n, k]` -> `[max_loras, n, k]` (a view)."""
    if weight.dim() == 4:
        if weight.size(1) != 1:
            raise ValueError(f"stacked LoRA weight has shape {tuple(weight.shape)}")
        return weight[:, 0]
    if weight.dim() != 3:
        raise ValueError(f"stacked LoRA weight has shape {tuple(weight.shape)}")
    return weight


def check_meta(
    num_rows: int,
    token_lora_mapping: torch.Tensor,
    token_indices_sorted_by_lora_ids: torch.Tensor,
    num_tokens_per_lora: torch.Tensor,
    lora_token_start_loc: torch.Tensor,
    lora_ids: torch.Tensor,
) -> None:
    if not token_lora_mapping.size(0) == token_indices_sorted_by_lora_ids.size(0) == num_rows:
        raise ValueError(
            f"{num_rows} input rows but metadata for {token_lora_mapping.size(0)} tokens"
        )
    if lora_ids.size(0) != num_tokens_per_lora.size(0) or (
        lora_token_start_loc.size(0) != lora_ids.size(0) + 1
    ):
        raise ValueError("inconsistent LoRA kernel metadata sizes")


SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def fp32_dot(weight: torch.Tensor) -> bool:
    """Whether a kernel multiplies in float32 (see `tile_matmul`)."""
    return weight.dtype == torch.float32 or os.environ.get("TRITON_INTERPRET") == "1"
