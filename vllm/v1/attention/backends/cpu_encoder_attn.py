"""Encoder-only attention on CPU for a whole step at once: requests of
similar length are padded into buckets and each bucket is one SDPA call.

Why: the per-request loop costs ~6 tensor ops per request per layer (views,
two matmuls or one SDPA, the write back). A step of an embedding workload
holds tens to hundreds of short requests, so a BERT-base layer ran ~100
small ops, each a parallel region; with 2 OpenMP threads on a busy machine
every region waits for both threads to be scheduled, and attention took
more time than the 4 linear layers (profile: 12 s of 19 s on 16 requests of
32-256 tokens). A bucket costs 4 ops whatever its size (one gather when q, k
and v are column blocks of one fused QKV output, as the models make them).

Layout, per bucket of `n` requests padded to `padded_len` (= its longest):
- `gather_ids` [n * padded_len]: the step's token row for each padded slot,
  request-major; slots past a request's end repeat its first row (finite
  values; they are masked as keys and their query outputs are dropped).
- `key_mask` [n, 1, 1, padded_len] bool, True = a real key; None when every
  request of the bucket has the same length.
- `out_rows` / `token_ids` [tokens of the bucket]: where each real token sits
  in the padded output ([n * padded_len] rows) and in the step.
Buckets are built once per step (the metadata caches them) and shared by all
layers. A request alone in its group is attended in place (no padding).
Sorting by length and closing a bucket when a request is shorter
than `_MIN_LEN_RATIO` x the bucket's longest bounds the padding: a bucket's
attention FLOPs are at most 1 / ratio**2 of the unpadded ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

_MIN_LEN_RATIO = 0.75


@dataclass
class EncoderBucket:
    """Requests attended by one padded SDPA call (see the module docstring)."""

    num_seqs: int
    padded_len: int
    gather_ids: torch.Tensor  # [num_seqs * padded_len] int64
    key_mask: torch.Tensor | None  # [num_seqs, 1, 1, padded_len] bool, True = attend
    out_rows: torch.Tensor  # [num_tokens] int64, rows of the padded output
    token_ids: torch.Tensor  # [num_tokens] int64, rows of the step


def plan_buckets(
    starts: list[int], lengths: list[int], device: torch.device, ratio: float = _MIN_LEN_RATIO
) -> tuple[list[int], list[EncoderBucket]]:
    """Group requests (token rows starts[i] .. starts[i] + lengths[i]) by
    length, longest first: (requests alone in their group, which need no
    padding and are attended in place, buckets of the others)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if not groups or lengths[i] < ratio * lengths[groups[-1][0]]:
            groups.append([])
        groups[-1].append(i)
    singles = [g[0] for g in groups if len(g) == 1]
    buckets = [
        _bucket([starts[i] for i in g], [lengths[i] for i in g], device)
        for g in groups
        if len(g) > 1
    ]
    return singles, buckets


def _bucket(starts: list[int], lengths: list[int], device: torch.device) -> EncoderBucket:
    n, padded = len(lengths), max(lengths)
    start = torch.tensor(starts, dtype=torch.int64)[:, None]
    length = torch.tensor(lengths, dtype=torch.int64)[:, None]
    pos = torch.arange(padded, dtype=torch.int64)[None, :]
    real = pos < length  # [n, padded]
    gather = torch.where(real, start + pos, start)
    out_rows = (torch.arange(n)[:, None] * padded + pos)[real]
    mask = None if all(x == padded for x in lengths) else real[:, None, None, :].to(device)
    return EncoderBucket(
        n, padded, gather.reshape(-1).to(device), mask, out_rows.to(device), gather[real].to(device)
    )


def _fused_rows(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor | None:
    """[T, (H + 2 Hkv) * D] over the same memory when q, k, v are the three
    column blocks of one fused QKV projection output (rows of H*D query,
    Hkv*D key, Hkv*D value elements side by side, same row stride, one
    storage), else None. Then one gather serves all three."""
    tensors = (query, key, value)
    widths = [x.shape[1] * x.shape[2] for x in tensors]
    size = query.element_size()
    dense_rows = all(x.stride(2) == 1 and x.stride(1) == x.shape[2] for x in tensors)
    one_storage = all(
        x.untyped_storage().data_ptr() == query.untyped_storage().data_ptr() for x in tensors
    )
    if not (dense_rows and one_storage and key.stride(0) == value.stride(0) == query.stride(0)):
        return None
    if key.data_ptr() != query.data_ptr() + widths[0] * size:
        return None
    if value.data_ptr() != key.data_ptr() + widths[1] * size:
        return None
    return query.as_strided((query.shape[0], sum(widths)), (query.stride(0), 1))


def bucketed_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    buckets: list[EncoderBucket],
    scale: float,
    output: torch.Tensor,
) -> None:
    """query [T, H, D], key/value [T, Hkv, D] -> writes output [T, H, D] rows
    of the bucketed requests (bidirectional within each request)."""
    heads, kv_heads, head_size = query.shape[1], key.shape[1], query.shape[2]
    fused = _fused_rows(query, key, value)
    for b in buckets:
        n, length = b.num_seqs, b.padded_len
        if fused is not None:
            rows = fused.index_select(0, b.gather_ids).view(n, length, -1, head_size)
            q, k, v = rows.split([heads, kv_heads, kv_heads], dim=2)
        else:
            q, k, v = (x.index_select(0, b.gather_ids).view(n, length, -1, head_size)
                       for x in (query, key, value))  # fmt: skip
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),  # [n, h, L, D] views; SDPA takes the strides
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=b.key_mask,
            scale=scale,
            enable_gqa=heads != kv_heads,
        )  # [n, H, L, D]
        flat = out.transpose(1, 2).reshape(n * length, heads, head_size)
        output.index_copy_(0, b.token_ids, flat.index_select(0, b.out_rows))
