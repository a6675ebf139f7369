"""RequestState rows, staged writes and block tables of Model Runner V2."""

import numpy as np
import pytest
import torch

from vllm.v1.worker.gpu.block_table import PAD_SLOT_ID, BlockTables, token_batch_indices
from vllm.v1.worker.gpu.buffer_utils import StagedWriteTensor
from vllm.v1.worker.gpu.states import RequestState

CPU = torch.device("cpu")


def make_states(max_num_reqs: int = 4) -> RequestState:
    return RequestState(
        max_num_reqs=max_num_reqs,
        max_model_len=32,
        max_num_batched_tokens=64,
        num_speculative_steps=0,
        vocab_size=100,
        device=CPU,
    )


def test_request_keeps_its_row_and_freed_rows_are_reused():
    states = make_states()
    rows = {rid: states.add_request(rid, 3, [1, 2, 3], 0) for rid in "abc"}
    assert sorted(rows.values()) == [0, 1, 2]
    assert states.index_to_req_id == {v: k for k, v in rows.items()}
    # Removing one request leaves every other request in its row.
    assert states.remove_request("b") == rows["b"]
    assert states.remove_request("b") is None
    assert {rid: states.req_id_to_index[rid] for rid in "ac"} == {"a": rows["a"], "c": rows["c"]}
    # The freed row is the next one handed out; then the never-used one.
    assert states.add_request("d", 2, [7, 8], 0) == rows["b"]
    assert states.add_request("e", 1, [9], 0) == 3
    assert states.num_reqs == 4
    with pytest.raises(RuntimeError, match="rows are in use"):
        states.add_request("f", 1, [1], 0)
    with pytest.raises(ValueError, match="already has a row"):
        states.add_request("a", 1, [1], 0)


def test_add_request_stages_tokens_and_lengths_until_applied():
    states = make_states()
    # A resumed request: 3 prompt tokens + 2 generated, 4 of them cached.
    row = states.add_request("r", 3, [5, 6, 7, 8, 9], num_computed_tokens=4)
    assert int(states.total_len.gpu[row]) == 0  # staged, not applied yet
    states.apply_staged_writes()
    assert states.all_token_ids.gpu[row, :5].tolist() == [5, 6, 7, 8, 9]
    assert (int(states.prompt_len.gpu[row]), int(states.prefill_len.gpu[row])) == (3, 5)
    assert int(states.total_len.gpu[row]) == 5
    assert int(states.num_computed_tokens.gpu[row]) == 4
    assert states.num_computed_tokens_np[row] == 4
    assert states.num_computed_prefill_tokens[row] == 4
    with pytest.raises(ValueError, match="prefill length"):
        states.add_request("bad", 4, [1, 2], 0)


def test_set_num_computed_tokens_writes_device_and_mirror():
    states = make_states()
    for rid in "abc":
        states.add_request(rid, 2, [1, 2], 0)
    states.apply_staged_writes()
    idx = np.array([states.req_id_to_index["c"], states.req_id_to_index["a"]])
    states.set_num_computed_tokens(idx, np.array([5, 9], dtype=np.int32))
    got = states.num_computed_tokens.gpu[torch.from_numpy(idx)].tolist()
    assert got == [5, 9] and states.num_computed_tokens_np[idx].tolist() == [5, 9]
    assert int(states.num_computed_tokens.gpu[states.req_id_to_index["b"]]) == 0


def test_staged_writes_apply_in_order_and_clear():
    t = StagedWriteTensor((3, 8), torch.int32, CPU)
    t.stage_write(1, 2, [1, 2, 3])
    t.stage_write(1, 3, [9])  # a later write to the same place wins
    t.stage_write(2, 0, [])  # empty: nothing staged
    t.stage_write(0, 6, [4, 5])
    assert t.has_staged_writes
    t.apply_write()
    assert not t.has_staged_writes
    assert t.gpu.tolist() == [[0] * 6 + [4, 5], [0, 0, 1, 9, 3, 0, 0, 0], [0] * 8]
    t.apply_write()  # nothing staged: no change
    assert t.gpu[1].tolist() == [0, 0, 1, 9, 3, 0, 0, 0]
    elems = StagedWriteTensor(4, torch.float32, CPU)
    elems.stage_write_elem(3, 1.5)
    elems.stage_write_elem(0, -2.0)
    elems.apply_write()
    assert elems.gpu.tolist() == [-2.0, 0.0, 0.0, 1.5]
    with pytest.raises(ValueError, match="Unsupported dtype"):
        StagedWriteTensor(4, torch.bool, CPU)


def test_block_tables_append_replace_gather_and_slots():
    bt = BlockTables(
        block_sizes=[4], max_num_reqs=4, max_num_batched_tokens=16, max_model_len=16, device=CPU
    )
    bt.append_block_ids(2, ([7, 3],), overwrite=True)
    bt.append_block_ids(0, ([5],), overwrite=True)
    bt.apply_staged_writes()
    bt.append_block_ids(2, ([8],), overwrite=False)
    bt.append_block_ids(0, ([6, 1],), overwrite=True)  # a resumed request: new blocks
    bt.apply_staged_writes()
    assert bt.num_blocks[0, [0, 2]].tolist() == [2, 3]
    idx_mapping = torch.tensor([2, 0])
    (tables,) = bt.gather_block_tables(idx_mapping)
    assert tables[:, :3].tolist() == [[7, 3, 8], [6, 1, 0]]
    # Row 2 computes positions 5..9 (blocks 3 and 8), row 0 position 4 (block 1).
    qsl = torch.tensor([0, 5, 6], dtype=torch.int32)
    pos = torch.tensor([5, 6, 7, 8, 9, 4])
    slots = bt.compute_slot_mappings(idx_mapping, qsl, pos)
    assert slots.shape == (1, 6)
    assert slots[0].tolist() == [13, 14, 15, 32, 33, 4]
    assert (bt.slot_mappings[0, 6:] == PAD_SLOT_ID).all()
    with pytest.raises(ValueError, match="needs 5 blocks"):
        bt.append_block_ids(1, ([1, 2, 3, 4, 5],), overwrite=True)


def test_token_batch_indices_matches_repeat_interleave():
    """Batch position per token (a binary search over the query ends): empty
    queries are skipped and trailing padding entries change nothing."""
    for lens in ([3, 1, 4], [0, 2, 0, 0, 3], [1], [2, 0]):
        qsl = torch.tensor([0, *np.cumsum(lens)], dtype=torch.int32)
        total = int(qsl[-1])
        want = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
        got = token_batch_indices(qsl, total)
        assert got.dtype == torch.int64 and got.tolist() == want.tolist(), lens
        padded = torch.cat([qsl, qsl[-1:].repeat(2)])
        assert token_batch_indices(padded, total).tolist() == want.tolist(), lens
