"""Helpers shared by attention backends (upstream: vllm/v1/attention/backends/utils.py)."""

from __future__ import annotations

import torch

from vllm.v1.attention.backend import CommonAttentionMetadata


def split_decodes_and_prefills(
    common_attn_metadata: CommonAttentionMetadata,
    decode_threshold: int = 1,
) -> tuple[int, int, int, int]:
    """Split a batch whose decodes come first (the runner's reorder contract).

    Returns (num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens).
    The decode part is the longest prefix of requests whose query length is
    <= `decode_threshold`; every request after it is treated as a prefill,
    which is always correct (the prefill path handles any query length).
    """
    num_reqs = common_attn_metadata.num_reqs
    num_tokens = common_attn_metadata.num_actual_tokens
    if num_reqs == 0:
        return 0, 0, 0, 0
    if common_attn_metadata.max_query_len <= decode_threshold:
        return num_reqs, 0, num_tokens, 0
    qsl = common_attn_metadata.query_start_loc_cpu[: num_reqs + 1]
    query_lens = qsl[1:] - qsl[:-1]
    is_prefill = query_lens > decode_threshold
    # First request that is not a decode; all before it are decodes.
    first_prefill = int(torch.argmax(is_prefill.to(torch.int8)).item())
    num_decode_tokens = int(qsl[first_prefill].item())
    return (
        first_prefill,
        num_reqs - first_prefill,
        num_decode_tokens,
        num_tokens - num_decode_tokens,
    )
