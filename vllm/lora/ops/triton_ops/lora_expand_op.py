"""Triton LoRA expand (upstream: vllm/lora/ops/triton_ops/lora_expand_op.py):
`output[t, off_s : off_s + n_s] (+)= inputs[s, t] @ B_s[slot(t)].T`, slices
side by side from `offset_start`; rows of tokens without an adapter are
never written.

Layouts: inputs `[num_slices, num_tokens, rank]` (the shrink output); each
`lora_b_weights[s]` `[max_loras, (1,) n_s, rank]`; output `[num_tokens,
total width]`. One launch per slice (upstream: one launch for all).
"""

from __future__ import annotations

import torch

from vllm.lora.ops.triton_ops.kernel_utils import (
    SUPPORTED_DTYPES,
    as_3d,
    check_meta,
    fp32_dot,
    group_rows,
    tile_matmul,
)
from vllm.triton_utils import tl, triton

BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 16


@triton.jit
def _lora_expand_kernel(
    input_ptr,
    lora_ptr,
    out_ptr,
    N,
    K,
    sorted_ids_ptr,
    num_tokens_per_lora_ptr,
    lora_token_start_loc_ptr,
    lora_ids_ptr,
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
    group = tl.program_id(axis=1)
    lora_id = tl.load(lora_ids_ptr + group)
    if lora_id == -1:
        return
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
    out = out_ptr + rows[:, None] * output_d0_stride + offs_n[None, :] * output_d1_stride
    mask = row_mask[:, None] & n_mask[None, :]
    # The sum is formed in float32 and rounded once (upstream rounds the
    # product to the output dtype first, then adds).
    if ADD_INPUTS:
        acc += tl.load(out, mask=mask, other=0.0).to(tl.float32)
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


@torch.inference_mode()
def lora_expand(
    inputs: torch.Tensor,
    lora_b_weights: list[torch.Tensor] | tuple[torch.Tensor, ...],
    output_tensor: torch.Tensor,
    token_lora_mapping: torch.Tensor,
    token_indices_sorted_by_lora_ids: torch.Tensor,
    num_tokens_per_lora: torch.Tensor,
    lora_token_start_loc: torch.Tensor,
    lora_ids: torch.Tensor,
    no_lora_flag_cpu: torch.Tensor,
    num_active_loras: torch.Tensor,
    offset_start: int = 0,
    add_inputs: bool = False,
) -> None:
    """Metadata arguments as `LoRAKernelMeta.meta_args` returns them."""
    if bool(no_lora_flag_cpu.item()):
        return
    if inputs.dim() != 3 or inputs.size(0) != len(lora_b_weights):
        raise ValueError("inputs must be [num_slices, num_tokens, rank]")
    M, K = inputs.size(1), inputs.size(2)
    check_meta(
        M,
        token_lora_mapping,
        token_indices_sorted_by_lora_ids,
        num_tokens_per_lora,
        lora_token_start_loc,
        lora_ids,
    )
    offset = offset_start
    for s, weight in enumerate(lora_b_weights):
        w = as_3d(weight)
        if w.dtype not in SUPPORTED_DTYPES or w.size(-1) != K:
            raise ValueError(f"lora_b weight {s}: {tuple(w.shape)} {w.dtype} vs rank {K}")
        N = w.size(1)
        if offset + N > output_tensor.size(1):
            raise ValueError(f"slice {s} ends at column {offset + N} > {output_tensor.size(1)}")
        out = output_tensor[:, offset : offset + N]
        x = inputs[s]
        grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N), int(num_active_loras.item()))
        _lora_expand_kernel[grid](
            x,
            w,
            out,
            N,
            K,
            token_indices_sorted_by_lora_ids,
            num_tokens_per_lora,
            lora_token_start_loc,
            lora_ids,
            x.stride(0),
            x.stride(1),
            w.stride(0),
            w.stride(1),
            w.stride(2),
            out.stride(0),
            out.stride(1),
            BLOCK_M=BLOCK_M,
            BLOCK_N=BLOCK_N,
            BLOCK_K=BLOCK_K,
            ADD_INPUTS=add_inputs,
            FP32_DOT=fp32_dot(w),
        )
        offset += N
