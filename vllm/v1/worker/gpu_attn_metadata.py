"""Attention metadata of one V1 runner step (upstream: part of
`_build_attention_metadata` of vllm/v1/worker/gpu_model_runner.py; a function
here to keep the runner within the house size limit)."""

from __future__ import annotations

import torch

from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.worker.block_table import MultiGroupBlockTable
from vllm.v1.worker.utils import AttentionGroup, CpuGpuBuffer, build_group_attn_metadata


def build_attention_metadata(
    attn_groups: list[list[AttentionGroup]],
    block_table: MultiGroupBlockTable,
    query_start_loc: CpuGpuBuffer,
    seq_lens: CpuGpuBuffer,
    num_reqs: int,
    num_tokens: int,
    max_query_len: int,
    max_seq_len: int,
    num_computed_tokens_cpu: torch.Tensor,
    for_cudagraph_capture: bool = False,
) -> dict[str, object]:
    """One metadata object per attention group (per KV cache group, per
    backend), mapped to each of its layers. The buffers hold the committed
    (padded) batch: query_start_loc [num_reqs + 1], seq_lens [num_reqs]."""
    attn_metadata: dict[str, object] = {}
    for gid, groups in enumerate(attn_groups):
        group_table = block_table[gid]
        common = CommonAttentionMetadata(
            query_start_loc=query_start_loc.gpu[: num_reqs + 1],
            query_start_loc_cpu=query_start_loc.cpu[: num_reqs + 1],
            seq_lens=seq_lens.gpu[:num_reqs],
            seq_lens_cpu=seq_lens.cpu[:num_reqs],
            num_computed_tokens_cpu=num_computed_tokens_cpu,
            num_reqs=num_reqs,
            num_actual_tokens=num_tokens,
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            block_table_tensor=group_table.get_device_tensor(num_reqs),
            slot_mapping=group_table.slot_mapping.gpu[:num_tokens],
        )
        build_group_attn_metadata(groups, common, for_cudagraph_capture, attn_metadata)
    return attn_metadata
