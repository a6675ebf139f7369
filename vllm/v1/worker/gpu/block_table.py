"""Block tables of Model Runner V2 (upstream: vllm/v1/worker/gpu/block_table.py).

One table per KV cache group, `[max_num_reqs, max_num_blocks]` int32, indexed
by the request's permanent row. Token position `p` of the request in row r
lives in KV slot

    block_tables[g][r, p // block_size] * block_size + p % block_size

Each step the rows of the batch are gathered into `input_block_tables` (batch
order, what attention reads) and the slot of every scheduled token is computed
on the device from the positions, so the host never builds per-token arrays.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm.triton_utils import HAS_TRITON, tl, triton
from vllm.utils import cdiv
from vllm.v1.worker.gpu.buffer_utils import StagedWriteTensor

# Slot of a token that must not be written (padding).
PAD_SLOT_ID = -1


class BlockTables:
    """Block ids of every live request, per KV cache group."""

    def __init__(
        self,
        block_sizes: list[int],
        max_num_reqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        device: torch.device,
    ) -> None:
        self.block_sizes = block_sizes
        self.max_num_reqs = max_num_reqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.device = device
        self.num_kv_cache_groups = len(block_sizes)

        # Per group [max_num_reqs, max_num_blocks], indexed by request row.
        self.block_tables: list[StagedWriteTensor] = [
            StagedWriteTensor((max_num_reqs, cdiv(max_model_len, bs)), torch.int32, device)
            for bs in block_sizes
        ]
        # [num_groups, max_num_reqs]: blocks each row holds (host side).
        self.num_blocks = np.zeros((self.num_kv_cache_groups, max_num_reqs), dtype=np.int32)
        # Per group [max_num_reqs, max_num_blocks], indexed by batch position.
        self.input_block_tables: list[torch.Tensor] = [
            torch.zeros_like(bt.gpu) for bt in self.block_tables
        ]
        # [num_groups, max_num_batched_tokens]; entries past the step's tokens are PAD_SLOT_ID.
        self.slot_mappings = torch.full(
            (self.num_kv_cache_groups, max_num_batched_tokens),
            PAD_SLOT_ID,
            dtype=torch.int64,
            device=device,
        )

    def append_block_ids(
        self, req_index: int, new_block_ids: tuple[list[int], ...], overwrite: bool
    ) -> None:
        """Add blocks after the row's current ones, or (overwrite) replace them."""
        for g, block_ids in enumerate(new_block_ids):
            start = 0 if overwrite else int(self.num_blocks[g, req_index])
            end = start + len(block_ids)
            if end > self.block_tables[g].gpu.shape[1]:
                raise ValueError(
                    f"Request row {req_index} needs {end} blocks in group {g}; "
                    f"a row holds {self.block_tables[g].gpu.shape[1]}."
                )
            self.block_tables[g].stage_write(req_index, start, block_ids)
            self.num_blocks[g, req_index] = end

    def apply_staged_writes(self) -> None:
        for block_table in self.block_tables:
            block_table.apply_write()

    def gather_block_tables(self, idx_mapping: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Rows of the batch, in batch order: per group [num_reqs, max_num_blocks].

        Whole rows are copied (blocks past a row's count are stale but unread:
        attention only reads blocks below the sequence length).
        """
        num_reqs = idx_mapping.shape[0]
        out = []
        for src, dst in zip(self.block_tables, self.input_block_tables):
            torch.index_select(src.gpu, 0, idx_mapping, out=dst[:num_reqs])
            out.append(dst[:num_reqs])
        return tuple(out)

    def compute_slot_mappings(
        self, idx_mapping: torch.Tensor, query_start_loc: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """[num_groups, num_tokens] int64: the KV slot of every scheduled token.

        Entries past `num_tokens` are reset to PAD_SLOT_ID (for padded batches).
        """
        num_tokens = positions.shape[0]
        for g, (block_table, block_size) in enumerate(zip(self.block_tables, self.block_sizes)):
            compute_slot_mapping(
                self.slot_mappings[g],
                block_table.gpu,
                block_size,
                idx_mapping,
                query_start_loc,
                positions,
            )
        return self.slot_mappings[:, :num_tokens]

    def get_dummy_slot_mappings(self, num_tokens: int) -> torch.Tensor:
        """All padding: a dummy run writes nothing into the KV cache."""
        self.slot_mappings.fill_(PAD_SLOT_ID)
        return self.slot_mappings[:, :num_tokens]


def token_batch_indices(query_start_loc: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """[num_tokens] int64: the batch position each flattened token belongs to,
    i.e. the first i with query_start_loc[i + 1] > token (empty queries are
    skipped). A binary search, not torch.repeat_interleave: on the CPU with
    more than one torch thread the latter took ~6 ms per call for 16 tokens
    (2-core EPYC; 3 us with one thread), searchsorted ~3 us."""
    ends = query_start_loc[1:].contiguous()
    tokens = torch.arange(num_tokens, device=ends.device, dtype=ends.dtype)
    return torch.searchsorted(ends, tokens, right=True)


def compute_slot_mapping(
    out: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
) -> None:
    """Fill `out[:num_tokens]` with the slots of one KV cache group and `out[num_tokens:]`
    with PAD_SLOT_ID. block_table: [max_num_reqs, max_num_blocks] by request row."""
    if out.is_cuda and HAS_TRITON:
        _compute_slot_mapping_triton(
            out, block_table, block_size, idx_mapping, query_start_loc, positions
        )
    else:
        _compute_slot_mapping_torch(
            out, block_table, block_size, idx_mapping, query_start_loc, positions
        )


def _compute_slot_mapping_torch(
    out: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
) -> None:
    num_tokens = positions.shape[0]
    rows = idx_mapping.to(torch.int64)
    if num_tokens != rows.shape[0]:  # else one token per request: token i is request i
        rows = rows[token_batch_indices(query_start_loc, num_tokens)]
    # Flat index of the table entry holding each token's block.
    flat = rows * block_table.stride(0) + torch.div(positions, block_size, rounding_mode="floor")
    block_numbers = block_table.view(-1)[flat]
    slots = out[:num_tokens]
    torch.mul(block_numbers, block_size, out=slots)
    slots += torch.remainder(positions, block_size)
    out[num_tokens:] = PAD_SLOT_ID


def _compute_slot_mapping_triton(
    out: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
) -> None:
    num_reqs = idx_mapping.shape[0]
    # The extra last program pads the tail of `out`.
    _compute_slot_mapping_kernel[(num_reqs + 1,)](
        out,
        out.shape[0],
        positions.shape[0],
        block_table,
        block_table.stride(0),
        block_size,
        idx_mapping,
        query_start_loc,
        positions,
        PAD_ID=PAD_SLOT_ID,
        BLOCK_SIZE=1024,
    )


@triton.jit
def _compute_slot_mapping_kernel(
    out_ptr,
    max_num_tokens,
    num_tokens,
    block_table_ptr,
    block_table_stride,
    block_size,
    idx_mapping_ptr,
    query_start_loc_ptr,
    pos_ptr,
    PAD_ID: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    batch_idx = tl.program_id(0)
    if batch_idx == tl.num_programs(0) - 1:
        for i in range(num_tokens, max_num_tokens, BLOCK_SIZE):
            offs = i + tl.arange(0, BLOCK_SIZE)
            tl.store(out_ptr + offs, PAD_ID, mask=offs < max_num_tokens)
        return
    row = tl.load(idx_mapping_ptr + batch_idx).to(tl.int64)
    start = tl.load(query_start_loc_ptr + batch_idx)
    end = tl.load(query_start_loc_ptr + batch_idx + 1)
    for i in range(start, end, BLOCK_SIZE):
        offs = i + tl.arange(0, BLOCK_SIZE)
        mask = offs < end
        pos = tl.load(pos_ptr + offs, mask=mask, other=0)
        block_numbers = tl.load(
            block_table_ptr + row * block_table_stride + pos // block_size, mask=mask, other=0
        )
        slots = block_numbers.to(tl.int64) * block_size + pos % block_size
        tl.store(out_ptr + offs, slots, mask=mask)
