"""apply_grammar_bitmask on the V1 runner's real InputBatch, and the grammar
text helpers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.structured_output.utils import (
    apply_grammar_bitmask,
    choice_as_grammar,
    grammar_is_likely_lark,
)
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

VOCAB = 70  # 3 bitmask words (96 bits) cover it


def make_batch(req_ids: list[str]) -> InputBatch:
    batch = InputBatch(
        max_num_reqs=8,
        max_model_len=16,
        max_num_batched_tokens=32,
        device=torch.device("cpu"),
        pin_memory=False,
        vocab_size=VOCAB,
        block_sizes=[16],
    )
    for req_id in req_ids:
        batch.add_request(
            CachedRequestState(
                req_id=req_id,
                prompt_token_ids=[1, 2],
                mm_features=[],
                sampling_params=SamplingParams(),
                generator=None,
                block_ids=([0],),
                num_computed_tokens=0,
                output_token_ids=[],
            )
        )
    return batch


def bitmask_allowing(rows: list[set[int]], words: int = 3) -> np.ndarray:
    out = np.zeros((len(rows), words), dtype=np.int64)
    for i, allowed in enumerate(rows):
        for t in allowed:
            out[i, t // 32] |= 1 << (t % 32)
    # Reinterpret the unsigned 32-bit words as int32 (bit 31 is the sign).
    return out.astype(np.uint32).view(np.int32)


def check(logits_before: torch.Tensor, logits: torch.Tensor, allowed: dict[int, set[int]]):
    for row in range(logits.shape[0]):
        if row not in allowed:
            assert torch.equal(logits[row], logits_before[row]), f"row {row} was touched"
            continue
        for t in range(logits.shape[1]):
            if t in allowed[row]:
                assert logits[row, t] == logits_before[row, t]
            else:
                assert logits[row, t] == float("-inf"), (row, t)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_masks_the_right_rows_in_batch_order(dtype):
    batch = make_batch(["r0", "r1", "r2", "r3"])
    # Bitmask rows in the scheduler's order, not the batch's.
    output = GrammarOutput(["r3", "r1"], bitmask_allowing([{0, 5, 31}, {2, 32, 63, 69}]))
    logits = torch.randn(4, VOCAB).to(dtype)
    before = logits.clone()
    apply_grammar_bitmask(SchedulerOutput.make_empty(), output, batch, logits)
    check(before, logits, {3: {0, 5, 31}, 1: {2, 32, 63, 69}})


def test_padded_logits_beyond_the_bitmask_are_masked():
    batch = make_batch(["a", "b"])
    width = 3 * 32 + 10  # padded vocabulary wider than the bitmask's 96 ids
    output = GrammarOutput(["b"], bitmask_allowing([{1, 95}]))
    logits = torch.randn(2, width)
    before = logits.clone()
    apply_grammar_bitmask(SchedulerOutput.make_empty(), output, batch, logits)
    check(before, logits, {1: {1, 95}})


def test_noncontiguous_logits_use_the_torch_path():
    batch = make_batch(["a", "b", "c"])
    output = GrammarOutput(["c", "a"], bitmask_allowing([{7}, {8, 40}]))
    base = torch.randn(VOCAB, 3)
    logits = base.t()  # [3, VOCAB], not contiguous
    before = logits.clone()
    apply_grammar_bitmask(SchedulerOutput.make_empty(), output, batch, logits)
    check(before, logits, {2: {7}, 0: {8, 40}})


def test_spec_tokens_shift_rows_and_unknown_requests_are_skipped():
    batch = make_batch(["a", "b", "c"])
    sched = SchedulerOutput.make_empty()
    sched.scheduled_spec_decode_tokens = {"a": [4, 5]}  # rows 0-2 are a's, b is 3, c is 4
    output = GrammarOutput(["gone", "a", "c"], bitmask_allowing([{9}, {1}, {2}, {3}, {4}]))
    logits = torch.randn(5, VOCAB)
    before = logits.clone()
    apply_grammar_bitmask(sched, output, batch, logits)
    check(before, logits, {0: {1}, 1: {2}, 2: {3}, 4: {4}})


def test_holes_in_the_batch_have_no_logits_row():
    batch = make_batch(["a", "b", "c"])
    batch.remove_request("b")
    assert batch.req_ids[1] is None
    output = GrammarOutput(["c"], bitmask_allowing([{6}]))
    logits = torch.randn(2, VOCAB)  # rows of "a" and "c"
    before = logits.clone()
    apply_grammar_bitmask(SchedulerOutput.make_empty(), output, batch, logits)
    check(before, logits, {1: {6}})


def test_choice_as_grammar_escapes():
    assert (
        choice_as_grammar(["a", 'b"c', "d\\e", "f\ng"])
        == 'root ::= "a" | "b\\"c" | "d\\\\e" | "f\\ng"'
    )
    with pytest.raises(ValueError):
        choice_as_grammar([])


def test_grammar_is_likely_lark():
    assert not grammar_is_likely_lark('root ::= "a"\n')
    assert not grammar_is_likely_lark('# start: x\nroot ::= "a"')
    assert grammar_is_likely_lark('start: "a" | b\nb: "c"')
    assert not grammar_is_likely_lark("  ")


def random_case(rows: int, vocab: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    words = (vocab + 31) // 32
    bitmask = torch.randint(
        -(2**31), 2**31 - 1, (rows, words), generator=gen, dtype=torch.int64
    ).to(torch.int32)
    return torch.randn(rows, vocab + 5, generator=gen), bitmask


def test_torch_fallback_matches_xgrammar():
    import xgrammar as xgr

    from vllm.v1.structured_output.utils import _apply_torch

    logits, bitmask = random_case(6, 200)
    ours, theirs = logits.clone(), logits.clone()
    _apply_torch(ours, bitmask, [0, 2, 5], 200)
    xgr.apply_token_bitmask_inplace(theirs, bitmask, vocab_size=200, indices=[0, 2, 5])
    assert torch.equal(ours, theirs)
    assert torch.equal(ours[1], logits[1]) and torch.isinf(ours[0]).any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_logits_match_cpu():
    batch = make_batch(["a", "b", "c"])
    logits, bitmask = random_case(3, VOCAB, seed=1)
    output = GrammarOutput(["c", "a"], bitmask[:2].numpy())
    on_cpu, on_gpu = logits.clone(), logits.clone().cuda()
    apply_grammar_bitmask(SchedulerOutput.make_empty(), output, batch, on_cpu)
    apply_grammar_bitmask(SchedulerOutput.make_empty(), output, batch, on_gpu)
    assert torch.equal(on_gpu.cpu(), on_cpu)
