"""Write new K/V rows into the paged cache by slot, in Triton
(upstream: vllm/attention/ops/triton_reshape_and_cache_flash.py).

Grid: (num_tokens, num_kv_heads); a program copies one head of one token's key
and value (head_size elements each) to `slot // block_size`, row
`slot % block_size` of the caches. A negative slot (PAD_SLOT_ID: a padding or
dummy token) writes nothing. Unlike a boolean-mask gather in torch, the launch
never waits for the device, so it can be recorded in a CUDA graph, and its
grid depends only on the (padded) token count.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_ptr,
    k_stride_t,
    k_stride_h,
    v_stride_t,
    v_stride_h,
    kc_stride_b,
    kc_stride_t,
    kc_stride_h,
    vc_stride_b,
    vc_stride_t,
    vc_stride_h,
    BLOCK_SIZE: tl.constexpr,
    HEAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    # A padding slot masks every element off (the limit becomes 0).
    limit = (slot >= 0).to(tl.int32) * HEAD
    safe = tl.maximum(slot, 0)
    blk = safe // BLOCK_SIZE
    off = safe % BLOCK_SIZE
    d = tl.arange(0, HEAD_PAD)
    mask = d < limit
    k = tl.load(key_ptr + t * k_stride_t + h * k_stride_h + d, mask=mask)
    tl.store(
        key_cache_ptr + blk * kc_stride_b + off * kc_stride_t + h * kc_stride_h + d, k, mask=mask
    )
    v = tl.load(value_ptr + t * v_stride_t + h * v_stride_h + d, mask=mask)
    tl.store(
        value_cache_ptr + blk * vc_stride_b + off * vc_stride_t + h * vc_stride_h + d, v, mask=mask
    )


def triton_reshape_and_cache_flash(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """key/value [T, Hkv, D] (any token/head strides, unit element stride);
    caches [num_blocks, block_size, Hkv, D] (strided views are fine);
    slot_mapping [T] integer, < 0 = skip."""
    num_tokens, num_kv_heads, head_size = key.shape
    if num_tokens == 0:
        return
    for name, t in (
        ("key", key),
        ("value", value),
        ("key_cache", key_cache),
        ("value_cache", value_cache),
    ):
        assert t.stride(-1) == 1, f"{name}: the head dimension must be contiguous"
    assert slot_mapping.shape[0] >= num_tokens
    _reshape_and_cache_kernel[(num_tokens, num_kv_heads)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        BLOCK_SIZE=key_cache.shape[1],
        HEAD=head_size,
        HEAD_PAD=triton.next_power_of_2(head_size),
    )
