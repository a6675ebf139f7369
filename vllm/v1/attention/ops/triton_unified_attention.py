"""Unified paged attention in Triton: prefill chunks and decodes in one launch
(upstream: vllm/attention/ops/triton_unified_attention.py).

Grid: (num_tokens, num_kv_heads). A program takes one query token and the G =
num_heads / num_kv_heads query heads that share its kv head (rows padded to
G_PAD >= 16 for `tl.dot`), walks the token's sequence through the block table
one KV block at a time, and keeps an online softmax in fp32. Query token t of
a sequence with q_len new tokens and seq_len total sits at position
seq_len - (q_end - t) and sees keys 0..position (causal), restricted to the
last `window` of them with a sliding window; scores may be soft-capped.
Non-causal (`causal=False`, encoder-only layers): every query token of a
sequence sees all of its seq_len keys.

Caches: [num_blocks, block_size, num_kv_heads, head_size] (strided views of
the (2, ...) per-layer tensor are fine). One program per query token re-reads
a prefill's keys for each of its tokens; that is the simple form, not the
tiled one upstream uses for long prefills.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def kernel_unified_attention(
    out_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    block_table_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    token_seq_ptr,
    scale,
    soft_cap,
    window,
    q_stride_t,
    q_stride_h,
    o_stride_t,
    o_stride_h,
    k_stride_b,
    k_stride_t,
    k_stride_h,
    v_stride_b,
    v_stride_t,
    v_stride_h,
    bt_stride,
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    HEAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    t = tl.program_id(0)
    kvh = tl.program_id(1)
    seq = tl.load(token_seq_ptr + t)
    q_end = tl.load(query_start_loc_ptr + seq + 1)
    seq_len = tl.load(seq_lens_ptr + seq)
    pos = seq_len - (q_end - t)  # absolute position of this query token
    if not CAUSAL:
        pos = seq_len - 1  # the last key bounds every query

    g = tl.arange(0, G_PAD)
    d = tl.arange(0, HEAD_PAD)
    row_ok = g < G
    d_ok = d < HEAD
    heads = kvh * G + g
    q = tl.load(
        q_ptr + t * q_stride_t + heads[:, None] * q_stride_h + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    ).to(tl.float32)

    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, HEAD_PAD], tl.float32)
    first_key = 0
    if USE_WINDOW:
        first_key = tl.maximum(pos - window + 1, 0)
    offs = tl.arange(0, BLOCK_SIZE)
    for j in range(first_key // BLOCK_SIZE, pos // BLOCK_SIZE + 1):
        blk = tl.load(block_table_ptr + seq * bt_stride + j).to(tl.int64)
        kpos = j * BLOCK_SIZE + offs
        # fp32 operands with IEEE products: the interpreter's tl.dot is wrong
        # on bf16, and on a GPU fp32 dots would default to TF32.
        k = tl.load(
            k_ptr + blk * k_stride_b + offs[:, None] * k_stride_t + kvh * k_stride_h + d[None, :],
            mask=d_ok[None, :],
            other=0.0,
        ).to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # [G_PAD, BLOCK_SIZE]
        if USE_SOFTCAP:
            # tanh(x) = 1 - 2 / (exp(2x) + 1)
            x = s / soft_cap
            s = soft_cap * (1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0))
        valid = (kpos <= pos) & (kpos >= first_key)
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        v = tl.load(
            v_ptr + blk * v_stride_b + offs[:, None] * v_stride_t + kvh * v_stride_h + d[None, :],
            mask=d_ok[None, :],
            other=0.0,
        ).to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(
        out_ptr + t * o_stride_t + heads[:, None] * o_stride_h + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )


def unified_attention(
    out: torch.Tensor,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    token_to_seq: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    causal: bool = True,
) -> None:
    """query/out [T, H, D]; caches [NB, BS, Hkv, D]; block_table [num_seqs,
    max_blocks]; seq_lens [num_seqs] (cached + new tokens); query_start_loc
    [num_seqs + 1]; token_to_seq [T] (the sequence of each query row)."""
    if not causal and sliding_window:
        raise ValueError("unified_attention: a sliding window needs causal attention.")
    num_tokens, num_heads, head_size = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    if num_tokens == 0:
        return
    g = num_heads // num_kv_heads
    kernel_unified_attention[(num_tokens, num_kv_heads)](
        out,
        query,
        key_cache,
        value_cache,
        block_table,
        seq_lens,
        query_start_loc,
        token_to_seq,
        float(scale),
        float(soft_cap or 1.0),
        int(sliding_window or 0),
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        block_table.stride(0),
        G=g,
        G_PAD=max(16, triton.next_power_of_2(g)),
        HEAD=head_size,
        HEAD_PAD=max(16, triton.next_power_of_2(head_size)),
        BLOCK_SIZE=block_size,
        USE_SOFTCAP=bool(soft_cap),
        USE_WINDOW=bool(sliding_window),
        CAUSAL=causal,
    )
