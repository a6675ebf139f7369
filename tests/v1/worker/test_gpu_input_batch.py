"""InputBatch: add / remove / condense / swap keep every per-row array consistent."""

import random

import numpy as np
import torch

from vllm.sampling_params import SamplingParams
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

MAX_REQS, MAX_LEN, VOCAB, BLOCK = 8, 64, 100, 4


def make_batch() -> InputBatch:
    return InputBatch(MAX_REQS, MAX_LEN, 128, torch.device("cpu"), False, VOCAB, [BLOCK])


def make_request(i: int, rng: random.Random) -> CachedRequestState:
    prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 20))]
    outputs = [rng.randrange(VOCAB) for _ in range(rng.randint(0, 5))]
    num_tokens = len(prompt) + len(outputs)
    kind = i % 3
    params = (
        SamplingParams(temperature=0.0)
        if kind == 0
        else SamplingParams(temperature=0.7, top_k=5, top_p=0.9, seed=i)
        if kind == 1
        else SamplingParams(temperature=1.2, min_p=0.1, logprobs=2)
    )
    gen = torch.Generator().manual_seed(i) if params.seed is not None else None
    num_blocks = -(-num_tokens // BLOCK)
    return CachedRequestState(
        req_id=f"req-{i}",
        prompt_token_ids=prompt,
        mm_features=[],
        sampling_params=params,
        generator=gen,
        block_ids=([100 + 10 * i + b for b in range(num_blocks)],),
        num_computed_tokens=rng.randint(0, num_tokens - 1),
        output_token_ids=outputs,
    )


def assert_row_matches(batch: InputBatch, row: int, req: CachedRequestState) -> None:
    assert batch.req_ids[row] == req.req_id
    assert batch.req_id_to_index[req.req_id] == row
    n = req.num_tokens
    assert batch.num_tokens[row] == n
    assert batch.num_prompt_tokens[row] == req.num_prompt_tokens
    assert batch.token_ids_cpu[row, :n].tolist() == req.prompt_token_ids + req.output_token_ids
    assert batch.num_computed_tokens_cpu[row] == req.num_computed_tokens
    bt = batch.block_table[0]
    assert bt.block_table.np[row, : bt.num_blocks_per_row[row]].tolist() == req.block_ids[0]
    assert batch.req_output_token_ids[row] is req.output_token_ids
    params = req.sampling_params
    expected_t = -1.0 if params.temperature == 0.0 else params.temperature
    assert np.isclose(batch.temperature.np[row], expected_t)
    assert np.isclose(batch.top_p.np[row], params.top_p)
    assert batch.top_k.np[row] == (params.top_k if params.top_k > 0 else VOCAB)
    assert np.isclose(batch.min_p.np[row], params.min_p)
    assert batch.generators.get(row) is req.generator


def assert_batch_matches(batch: InputBatch, live: dict[str, CachedRequestState]) -> None:
    assert batch.num_reqs == len(live)
    assert sorted(batch.req_ids) == sorted(live)
    for row, req_id in enumerate(batch.req_ids):
        assert_row_matches(batch, row, live[req_id])
    assert set(batch.generators) == {
        row for row, rid in enumerate(batch.req_ids) if live[rid].generator is not None
    }


def test_random_add_remove_condense_swap():
    rng = random.Random(0)
    batch = make_batch()
    live: dict[str, CachedRequestState] = {}
    next_id = 0
    for _ in range(40):
        for req_id in rng.sample(sorted(live), k=rng.randint(0, len(live))):
            assert batch.remove_request(req_id) is not None
            del live[req_id]
        for _ in range(rng.randint(0, MAX_REQS - len(live))):
            req = make_request(next_id, rng)
            next_id += 1
            batch.add_request(req)
            live[req.req_id] = req
        batch.condense()
        assert_batch_matches(batch, live)
        if batch.num_reqs >= 2:
            i1, i2 = rng.sample(range(batch.num_reqs), 2)
            batch.swap_states(i1, i2)
            assert_batch_matches(batch, live)


def test_add_fills_the_lowest_hole_and_condense_moves_the_last_row():
    rng = random.Random(1)
    batch = make_batch()
    reqs = [make_request(i, rng) for i in range(5)]
    for req in reqs:
        batch.add_request(req)
    batch.remove_request("req-1")
    batch.remove_request("req-3")
    assert batch.remove_request("unknown") is None
    new = make_request(9, rng)
    assert batch.add_request(new) == 1  # lowest hole
    batch.condense()  # the last row (req-4) moves into hole 3
    assert batch.req_ids == ["req-0", "req-9", "req-2", "req-4"]


def test_sampling_metadata_flags():
    rng = random.Random(2)
    batch = make_batch()
    batch.add_request(make_request(0, rng))  # greedy
    batch.refresh_metadata()
    meta = batch.sampling_metadata
    assert meta.all_greedy and not meta.all_random
    assert meta.temperature is None and meta.top_k is None and meta.max_num_logprobs is None

    batch.add_request(make_request(1, rng))  # seeded, top-k, top-p
    batch.add_request(make_request(2, rng))  # min-p, logprobs=2
    batch.refresh_metadata()
    meta = batch.sampling_metadata
    assert not meta.all_greedy and not meta.all_random
    assert meta.temperature.tolist() == [-1.0, 0.699999988079071, 1.2000000476837158]
    assert meta.top_k.tolist() == [VOCAB, 5, VOCAB]
    assert meta.max_num_logprobs == 2
    assert set(meta.generators) == {1}

    batch.remove_request("req-0")
    batch.condense()
    batch.refresh_metadata()
    assert batch.sampling_metadata.all_random
    # req-2 (the last row) moved into hole 0; the seeded req-1 kept row 1.
    assert batch.req_ids == ["req-2", "req-1"]
    assert set(batch.sampling_metadata.generators) == {1}


def test_reorder_puts_decodes_first():
    from vllm.v1.worker.utils import reorder_batch_to_split_decodes_and_prefills

    rng = random.Random(3)
    for trial in range(20):
        batch = make_batch()
        live = {}
        for i in range(rng.randint(1, MAX_REQS)):
            req = make_request(100 * trial + i, rng)
            batch.add_request(req)
            live[req.req_id] = req
        scheduled = {r: rng.choice([1, 1, 2, 7]) for r in live}
        changed = reorder_batch_to_split_decodes_and_prefills(batch, scheduled, 1)
        is_decode = [scheduled[r] <= 1 for r in batch.req_ids]
        assert is_decode == sorted(is_decode, reverse=True)
        assert_batch_matches(batch, live)
        # Already split: a second call changes nothing.
        assert not reorder_batch_to_split_decodes_and_prefills(batch, scheduled, 1)
        if not changed:
            assert list(live) == batch.req_ids
