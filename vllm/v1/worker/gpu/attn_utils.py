"""Attention set-up and per-step metadata for Model Runner V2
(upstream: vllm/v1/worker/gpu/attn_utils.py).

KV cache specs, metadata builders, allocation and binding are shared with the
V1 runner (vllm/v1/worker/kv_cache_setup.py); what is V2's own is how a step's
metadata is assembled from the gathered block tables and slot mappings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.worker.utils import AttentionGroup, build_group_attn_metadata

if TYPE_CHECKING:
    from vllm.v1.worker.gpu.block_table import BlockTables
    from vllm.v1.worker.gpu.input_batch import InputBatch


def get_reorder_batch_threshold(attn_groups: list[list[AttentionGroup]]) -> int | None:
    """The smallest threshold any builder asks for: requests with at most this
    many query tokens (decodes) must come first in the batch."""
    thresholds = [
        g.metadata_builder.reorder_batch_threshold
        for groups in attn_groups
        for g in groups
        if g.metadata_builder.reorder_batch_threshold is not None
    ]
    return min(thresholds) if thresholds else None


def decodes_first_order(num_scheduled: np.ndarray, threshold: int | None) -> np.ndarray | None:
    """The stable batch order that puts requests with at most `threshold`
    scheduled tokens (decodes) before the others, as the backends that set a
    `reorder_batch_threshold` require; None when the batch already is so."""
    if threshold is None or len(num_scheduled) < 2:
        return None
    is_prefill = num_scheduled > threshold
    if not is_prefill.any() or is_prefill[-int(is_prefill.sum()) :].all():
        return None
    return np.argsort(is_prefill, kind="stable")


def build_attn_metadata(
    attn_groups: list[list[AttentionGroup]],
    num_reqs: int,
    num_tokens: int,
    query_start_loc: torch.Tensor,
    query_start_loc_cpu: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    num_computed_tokens_cpu: torch.Tensor,
    max_query_len: int,
    max_seq_len: int,
    block_tables: tuple[torch.Tensor, ...],
    slot_mappings: torch.Tensor,
    for_cudagraph_capture: bool = False,
) -> dict[str, Any]:
    """layer name -> its backend's metadata for this step.

    block_tables: per KV cache group [num_reqs, max_num_blocks] in batch order;
    slot_mappings: [num_groups, num_tokens]. `for_cudagraph_capture`: the
    builders' capture variant (a dummy batch about to be recorded).
    """
    attn_metadata: dict[str, Any] = {}
    for gid, groups in enumerate(attn_groups):
        common = CommonAttentionMetadata(
            query_start_loc=query_start_loc,
            query_start_loc_cpu=query_start_loc_cpu,
            seq_lens=seq_lens,
            seq_lens_cpu=seq_lens_cpu,
            num_computed_tokens_cpu=num_computed_tokens_cpu,
            num_reqs=num_reqs,
            num_actual_tokens=num_tokens,
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            block_table_tensor=block_tables[gid],
            slot_mapping=slot_mappings[gid],
        )
        build_group_attn_metadata(groups, common, for_cudagraph_capture, attn_metadata)
    return attn_metadata


def build_batch_attn_metadata(
    attn_groups: list[list[AttentionGroup]],
    batch: InputBatch,
    block_tables: tuple[torch.Tensor, ...],
    slot_mappings: torch.Tensor,
    for_cudagraph_capture: bool = False,
) -> dict[str, Any]:
    """`build_attn_metadata` over an unpadded `InputBatch`: its query starts,
    sequence lengths and computed-token counts (device tensors and host
    mirrors), with the given per-group block tables and slot mappings."""
    return build_attn_metadata(
        attn_groups,
        batch.num_reqs,
        batch.num_tokens,
        batch.query_start_loc,
        torch.from_numpy(batch.query_start_loc_np),
        batch.seq_lens,
        torch.from_numpy(batch.seq_lens_np),
        torch.from_numpy(batch.num_computed_tokens_np),
        max_query_len=int(batch.num_scheduled_tokens.max()),
        max_seq_len=int(batch.seq_lens_np.max()),
        block_tables=block_tables,
        slot_mappings=slot_mappings,
        for_cudagraph_capture=for_cudagraph_capture,
    )


def build_dummy_attn_metadata(
    attn_groups: list[list[AttentionGroup]],
    batch: InputBatch,
    block_tables: BlockTables,
    for_cudagraph_capture: bool = False,
) -> dict[str, Any]:
    """Metadata for a dummy batch (warm-up, capture): the batch's block-table
    rows are zeroed and every slot is padding, so attention reads block 0 and
    writes nothing to the KV cache."""
    tables = tuple(t[: batch.num_reqs].zero_() for t in block_tables.input_block_tables)
    return build_batch_attn_metadata(
        attn_groups,
        batch,
        tables,
        block_tables.get_dummy_slot_mappings(batch.num_tokens),
        for_cudagraph_capture=for_cudagraph_capture,
    )
