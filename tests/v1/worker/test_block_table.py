"""BlockTable row operations and slot mapping."""

import numpy as np
import pytest
import torch

from vllm.v1.worker.block_table import BlockTable, MultiGroupBlockTable

CPU = torch.device("cpu")


def make_table(block_size=4, max_reqs=4, max_blocks=8, max_tokens=64) -> BlockTable:
    return BlockTable(block_size, max_reqs, max_blocks, max_tokens, False, CPU)


def reference_slots(
    table: dict[int, list[int]], block_size: int, req_indices, positions
) -> list[int]:
    return [
        table[r][p // block_size] * block_size + p % block_size
        for r, p in zip(req_indices, positions)
    ]


def test_slot_mapping_matches_reference():
    bt = make_table()
    rows = {0: [3, 7, 1], 1: [5], 2: [2, 9]}
    for row, ids in rows.items():
        bt.add_row(ids, row)
    # Row 0: positions 2..10 (a chunk crossing two block boundaries);
    # row 1: one decode token at position 3; row 2: positions 4..6.
    req_indices = np.array([0] * 9 + [1] + [2] * 3)
    positions = np.concatenate([np.arange(2, 11), [3], np.arange(4, 7)])
    bt.compute_slot_mapping(req_indices, positions)
    got = bt.slot_mapping.np[: len(positions)].tolist()
    assert got == reference_slots(rows, 4, req_indices, positions)
    assert bt.slot_mapping.gpu.dtype == torch.int64


def test_append_add_move_swap():
    bt = make_table()
    bt.add_row([1, 2], 0)
    bt.append_row([3], 0)
    bt.add_row([4], 1)
    assert bt.num_blocks_per_row[:2].tolist() == [3, 1]
    assert bt.get_numpy_array()[0, :3].tolist() == [1, 2, 3]

    bt.swap_row(0, 1)
    assert bt.num_blocks_per_row[:2].tolist() == [1, 3]
    assert bt.get_numpy_array()[0, 0] == 4
    assert bt.get_numpy_array()[1, :3].tolist() == [1, 2, 3]

    bt.move_row(1, 3)
    assert bt.num_blocks_per_row[3] == 3
    assert bt.get_numpy_array()[3, :3].tolist() == [1, 2, 3]

    bt.add_row([8], 3)  # replace, not append
    assert bt.num_blocks_per_row[3] == 1
    assert bt.get_device_tensor(4)[3, 0].item() == 8


def test_row_overflow_is_an_error():
    bt = make_table(max_blocks=2)
    bt.add_row([1, 2], 0)
    with pytest.raises(ValueError):
        bt.append_row([3], 0)


def test_multi_group_tables_have_their_own_block_sizes():
    mg = MultiGroupBlockTable(
        max_num_reqs=2,
        max_model_len=32,
        max_num_batched_tokens=16,
        pin_memory=False,
        device=CPU,
        block_sizes=[4, 8],
    )
    assert [bt.max_num_blocks_per_req for bt in mg.block_tables] == [8, 4]
    mg.add_row(([1, 2, 3], [6, 7]), 0)
    mg.compute_slot_mapping(np.array([0, 0]), np.array([5, 9]))
    assert mg[0].slot_mapping.np[:2].tolist() == [2 * 4 + 1, 3 * 4 + 1]
    assert mg[1].slot_mapping.np[:2].tolist() == [6 * 8 + 5, 7 * 8 + 1]
