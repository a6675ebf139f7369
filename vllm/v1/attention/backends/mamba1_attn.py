"""Step metadata for Mamba-1 state layers (upstream:
vllm/v1/attention/backends/mamba1_attn.py).

A Mamba layer needs, per request of the step: where its tokens are in the
flattened batch, which state slot it owns (the one block of its Mamba KV
cache group, `block_table[:, 0]`), and whether that slot already holds the
state of its earlier tokens (num_computed_tokens > 0) or must start from
zeros (a new request, or one preempted and now recomputed from scratch).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vllm.model_executor.layers.mamba.ops.varlen import StateGroup, build_state_groups
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
)


@dataclass
class Mamba1AttentionMetadata:
    num_reqs: int
    num_actual_tokens: int
    query_start_loc: list[int]  # [num_reqs + 1], host ints
    state_indices: list[int]  # [num_reqs]: the state slot (block id) of each request
    has_initial_states: list[bool]  # [num_reqs]
    # The same requests laid out for the batched ops (decodes, prefills),
    # built once per step and shared by every layer of the group.
    state_groups: list[StateGroup] = field(default_factory=list)


class Mamba1AttentionMetadataBuilder(AttentionMetadataBuilder[Mamba1AttentionMetadata]):
    # Mamba does not care about the batch order.
    reorder_batch_threshold: int | None = None

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> Mamba1AttentionMetadata:
        cm = common_attn_metadata
        n = cm.num_reqs
        query_start_loc = cm.query_start_loc_cpu[: n + 1].tolist()
        state_indices = cm.block_table_tensor[:n, 0].tolist()
        has_initial_states = (cm.num_computed_tokens_cpu[:n] > 0).tolist()
        return Mamba1AttentionMetadata(
            num_reqs=n,
            num_actual_tokens=cm.num_actual_tokens,
            query_start_loc=query_start_loc,
            state_indices=state_indices,
            has_initial_states=has_initial_states,
            state_groups=build_state_groups(
                query_start_loc, cm.block_table_tensor.device, state_indices, has_initial_states
            ),
        )


class Mamba1AttentionBackend(AttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "MAMBA1_ATTN"

    @staticmethod
    def get_impl_cls():
        raise NotImplementedError("Mamba layers compute in the layer (MambaMixer).")

    @staticmethod
    def get_builder_cls() -> type[Mamba1AttentionMetadataBuilder]:
        return Mamba1AttentionMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        cache_dtype_str: str = "auto",
    ) -> tuple[int, ...]:
        raise NotImplementedError("Mamba states are shaped by MambaSpec.shapes.")


def view_mamba_states(
    raw: torch.Tensor,
    shapes: tuple[tuple[int, ...], ...],
    dtypes: tuple[torch.dtype, ...],
    num_blocks: int,
) -> tuple[torch.Tensor, ...]:
    """Split one layer's raw byte allocation into its state tensors, each
    [num_blocks, *shape] and contiguous (the tensors follow each other)."""
    states = []
    offset = 0
    for shape, dtype in zip(shapes, dtypes):
        nbytes = num_blocks * torch.Size(shape).numel() * dtype.itemsize
        if offset + nbytes > raw.numel():
            raise ValueError("Mamba state allocation is smaller than its spec.")
        states.append(raw[offset : offset + nbytes].view(dtype).view(num_blocks, *shape))
        offset += nbytes
    return tuple(states)
