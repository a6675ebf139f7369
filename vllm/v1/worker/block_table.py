"""Per-request KV block ids in the runner's persistent batch
(upstream: vllm/v1/worker/block_table.py).

Row i of the table holds the block ids of the request in batch row i:

    block_table_np[i, :num_blocks_per_row[i]] = [b0, b1, b2, ...]

Token position `pos` of that request lives in KV slot
`block_table[i, pos // block_size] * block_size + pos % block_size`.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm.utils import cdiv
from vllm.v1.worker.utils import CpuGpuBuffer


class BlockTable:
    """The block table of one KV cache group."""

    def __init__(
        self,
        block_size: int,
        max_num_reqs: int,
        max_num_blocks_per_req: int,
        max_num_batched_tokens: int,
        pin_memory: bool,
        device: torch.device,
    ) -> None:
        self.block_size = block_size
        self.max_num_reqs = max_num_reqs
        self.max_num_blocks_per_req = max_num_blocks_per_req
        self.max_num_batched_tokens = max_num_batched_tokens
        self.device = device
        # [max_num_reqs, max_num_blocks_per_req] int32; unused entries are stale.
        self.block_table = CpuGpuBuffer(
            max_num_reqs,
            max_num_blocks_per_req,
            dtype=torch.int32,
            device=device,
            pin_memory=pin_memory,
        )
        self.num_blocks_per_row = np.zeros(max_num_reqs, dtype=np.int32)
        # [max_num_batched_tokens] int64: the KV slot of every scheduled token.
        self.slot_mapping = CpuGpuBuffer(
            max_num_batched_tokens, dtype=torch.int64, device=device, pin_memory=pin_memory
        )

    def append_row(self, block_ids: list[int], row_idx: int) -> None:
        """Add `block_ids` after the blocks the row already has."""
        if not block_ids:
            return
        start = self.num_blocks_per_row[row_idx]
        end = start + len(block_ids)
        if end > self.max_num_blocks_per_req:
            raise ValueError(
                f"Request needs {end} blocks, more than the "
                f"{self.max_num_blocks_per_req} a row can hold."
            )
        self.num_blocks_per_row[row_idx] = end
        self.block_table.np[row_idx, start:end] = block_ids

    def add_row(self, block_ids: list[int], row_idx: int) -> None:
        """Replace the row's blocks with `block_ids`."""
        self.num_blocks_per_row[row_idx] = 0
        self.append_row(block_ids, row_idx)

    def clear_row(self, row_idx: int) -> None:
        self.num_blocks_per_row[row_idx] = 0

    def move_row(self, src: int, tgt: int) -> None:
        """Copy row `src` into row `tgt` (used when condensing the batch)."""
        num_blocks = self.num_blocks_per_row[src]
        table = self.block_table.np
        table[tgt, :num_blocks] = table[src, :num_blocks]
        self.num_blocks_per_row[tgt] = num_blocks

    def swap_row(self, src: int, tgt: int) -> None:
        """Exchange rows `src` and `tgt` (used when reordering the batch)."""
        counts = self.num_blocks_per_row
        counts[[src, tgt]] = counts[[tgt, src]]
        table = self.block_table.np
        table[[src, tgt]] = table[[tgt, src]]

    def compute_slot_mapping(self, req_indices: np.ndarray, positions: np.ndarray) -> None:
        """Fill `slot_mapping.np[:n]` for n scheduled tokens, vectorised.

        req_indices [n]: the batch row of each token; positions [n]: its
        position in its request.
        """
        n = positions.shape[0]
        # Flat index into the table of the block holding each token.
        flat_idx = req_indices * self.max_num_blocks_per_req + positions // self.block_size
        block_numbers = self.block_table.np.ravel()[flat_idx]
        slots = self.slot_mapping.np[:n]
        # int64 before multiplying: num_blocks * block_size can pass 2**31.
        np.multiply(block_numbers, self.block_size, out=slots, dtype=np.int64)
        slots += positions % self.block_size

    def commit_block_table(self, num_reqs: int) -> None:
        self.block_table.copy_to_gpu(num_reqs)

    def commit_slot_mapping(self, num_tokens: int) -> None:
        self.slot_mapping.copy_to_gpu(num_tokens)

    def clear(self) -> None:
        self.block_table.cpu.fill_(0)
        self.block_table.gpu.fill_(0)
        self.num_blocks_per_row[:] = 0

    def get_device_tensor(self, num_reqs: int) -> torch.Tensor:
        """[num_reqs, max_num_blocks_per_req] int32 on the device."""
        return self.block_table.gpu[:num_reqs]

    def get_cpu_tensor(self) -> torch.Tensor:
        return self.block_table.cpu

    def get_numpy_array(self) -> np.ndarray:
        return self.block_table.np


class MultiGroupBlockTable:
    """One `BlockTable` per KV cache group; row operations apply to all groups.

    Block ids come as a tuple with one list per group (as in
    `NewRequestData.block_ids`).
    """

    def __init__(
        self,
        max_num_reqs: int,
        max_model_len: int,
        max_num_batched_tokens: int,
        pin_memory: bool,
        device: torch.device,
        block_sizes: list[int],
    ) -> None:
        self.block_tables = [
            BlockTable(
                block_size,
                max_num_reqs,
                cdiv(max_model_len, block_size),
                max_num_batched_tokens,
                pin_memory,
                device,
            )
            for block_size in block_sizes
        ]

    def append_row(self, block_ids: tuple[list[int], ...], row_idx: int) -> None:
        for i, block_table in enumerate(self.block_tables):
            block_table.append_row(block_ids[i], row_idx)

    def add_row(self, block_ids: tuple[list[int], ...], row_idx: int) -> None:
        for i, block_table in enumerate(self.block_tables):
            block_table.add_row(block_ids[i], row_idx)

    def clear_row(self, row_idx: int) -> None:
        for block_table in self.block_tables:
            block_table.clear_row(row_idx)

    def move_row(self, src: int, tgt: int) -> None:
        for block_table in self.block_tables:
            block_table.move_row(src, tgt)

    def swap_row(self, src: int, tgt: int) -> None:
        for block_table in self.block_tables:
            block_table.swap_row(src, tgt)

    def compute_slot_mapping(self, req_indices: np.ndarray, positions: np.ndarray) -> None:
        for block_table in self.block_tables:
            block_table.compute_slot_mapping(req_indices, positions)

    def commit_block_table(self, num_reqs: int) -> None:
        for block_table in self.block_tables:
            block_table.commit_block_table(num_reqs)

    def commit_slot_mapping(self, num_tokens: int) -> None:
        for block_table in self.block_tables:
            block_table.commit_slot_mapping(num_tokens)

    def clear(self) -> None:
        for block_table in self.block_tables:
            block_table.clear()

    def __getitem__(self, idx: int) -> BlockTable:
        return self.block_tables[idx]

    def __len__(self) -> int:
        return len(self.block_tables)
