"""Triton LoRA shrink (upstream: vllm/lora/ops/triton_ops/lora_shrink_op.py):
`output[s, t, :rank] = scaling * inputs[t] @ A_s[slot(t)].T` for every slice
s; rows of tokens without an adapter are 0 (the output is zeroed first).

Layouts: inputs `[num_tokens, hidden]`; each `lora_a_weights[s]`
`[max_loras, (1,) rank, hidden]`; output `[num_slices, num_tokens, rank]`
(float32 in the Punica wrapper). Unlike upstream (one launch over all slices
through a table of weight pointers) each slice is one launch; unlike
upstream, float32 weights are accepted (multiplied at full precision).
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

BLOCK_M, BLOCK_N, BLOCK_K = 16, 16, 64


@triton.jit
def _lora_shrink_kernel(
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
    FP32_DOT: tl.constexpr,
):
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
    acc *= scaling
    out = out_ptr + rows[:, None] * output_d0_stride + offs_n[None, :] * output_d1_stride
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & n_mask[None, :])


@torch.inference_mode()
def lora_shrink(
    inputs: torch.Tensor,
    lora_a_weights: list[torch.Tensor] | tuple[torch.Tensor, ...],
    output_tensor: torch.Tensor,
    token_lora_mapping: torch.Tensor,
    token_indices_sorted_by_lora_ids: torch.Tensor,
    num_tokens_per_lora: torch.Tensor,
    lora_token_start_loc: torch.Tensor,
    lora_ids: torch.Tensor,
    no_lora_flag_cpu: torch.Tensor,
    num_active_loras: torch.Tensor,
    scaling: float,
) -> None:
    """Metadata arguments as `LoRAKernelMeta.meta_args` returns them."""
    if bool(no_lora_flag_cpu.item()):
        return
    M, K = inputs.shape
    check_meta(
        M,
        token_lora_mapping,
        token_indices_sorted_by_lora_ids,
        num_tokens_per_lora,
        lora_token_start_loc,
        lora_ids,
    )
    if output_tensor.dim() != 3 or output_tensor.size(0) != len(lora_a_weights):
        raise ValueError("output_tensor must be [num_slices, num_tokens, rank]")
    output_tensor.zero_()
    for s, weight in enumerate(lora_a_weights):
        w = as_3d(weight)
        if w.dtype not in SUPPORTED_DTYPES or w.size(-1) != K:
            raise ValueError(f"lora_a weight {s}: {tuple(w.shape)} {w.dtype} vs hidden {K}")
        N = w.size(1)
        out = output_tensor[s]
        grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N), int(num_active_loras.item()))
        _lora_shrink_kernel[grid](
            inputs,
            w,
            out,
            N,
            K,
            token_indices_sorted_by_lora_ids,
            num_tokens_per_lora,
            lora_token_start_loc,
            lora_ids,
            scaling,
            inputs.stride(0),
            inputs.stride(1),
            w.stride(0),
            w.stride(1),
            w.stride(2),
            out.stride(0),
            out.stride(1),
            BLOCK_M=BLOCK_M,
            BLOCK_N=BLOCK_N,
            BLOCK_K=BLOCK_K,
            FP32_DOT=fp32_dot(w),
        )
