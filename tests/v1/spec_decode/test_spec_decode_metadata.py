"""The V1 runner's logits layout under speculation
(vllm/v1/worker/spec_decode_utils.py): upstream's `_calc_spec_decode_metadata`
semantics, the layout SpecDecodeMetadata.make_dummy and the grammar bitmask
assume (per request its draft rows, then its bonus row), and what a model
drafter is told about the step's real tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
from vllm.v1.worker.spec_decode_utils import calc_spec_decode_metadata, num_valid_tokens

CPU = torch.device("cpu")


def _reference(num_drafts: list[int], num_scheduled: list[int], input_ids: list[int]):
    """Plain-Python layout: request i's logits rows are its last n_i + 1
    scheduled tokens; the first n_i score its drafts, the last is the bonus."""
    logits_indices, target, bonus, drafts = [], [], [], []
    start = 0
    for n, s in zip(num_drafts, num_scheduled):
        end = start + s
        first = len(logits_indices)
        logits_indices += list(range(end - n - 1, end))
        target += list(range(first, first + n))
        bonus.append(first + n)
        drafts += input_ids[end - n : end]
        start = end
    return logits_indices, target, bonus, drafts


@pytest.mark.parametrize(
    ("num_drafts", "num_scheduled"),
    [([3, 0, 2], [4, 10, 3]), ([0], [7]), ([1, 1, 1], [2, 2, 2]), ([0, 4], [1, 5])],
)
def test_layout_matches_the_reference(num_drafts, num_scheduled):
    rng = np.random.default_rng(0)
    input_ids = rng.integers(0, 1000, size=sum(num_scheduled)).astype(np.int32)
    md = calc_spec_decode_metadata(
        np.asarray(num_drafts, dtype=np.int32),
        np.cumsum(num_scheduled, dtype=np.int32),
        input_ids,
        CPU,
    )
    logits_indices, target, bonus, drafts = _reference(
        num_drafts, num_scheduled, input_ids.tolist()
    )
    assert md.logits_indices.tolist() == logits_indices
    assert md.target_logits_indices.tolist() == target
    assert md.bonus_logits_indices.tolist() == bonus
    assert md.draft_token_ids.tolist() == drafts
    assert md.num_draft_tokens == num_drafts
    assert md.cu_num_draft_tokens.tolist() == np.cumsum(num_drafts).tolist()
    assert md.max_spec_len == max(num_drafts)


def test_same_rows_as_make_dummy_for_pure_decode():
    """Decode rows (n drafts + 1 token each): the runner's rows are the ones
    make_dummy builds, which the rejection sampler's tests use."""
    drafts = [[5, 6, 7], [], [8, 9]]
    input_ids = np.asarray([1, 5, 6, 7, 2, 3, 8, 9], dtype=np.int32)
    md = calc_spec_decode_metadata(
        np.asarray([3, 0, 2], dtype=np.int32), np.asarray([4, 5, 8], dtype=np.int32), input_ids, CPU
    )
    dummy = SpecDecodeMetadata.make_dummy(drafts, CPU)
    for name in ("target_logits_indices", "bonus_logits_indices", "cu_num_sampled_tokens"):
        assert getattr(md, name).tolist() == getattr(dummy, name).tolist(), name
    assert md.logits_indices.tolist() == dummy.logits_indices.tolist()
    assert md.draft_token_ids.tolist() == dummy.draft_token_ids.tolist()


def test_num_valid_tokens():
    # decode row: 1 + 3 drafts, 2 accepted (3 emitted); a row finishing its
    # prefill (6 tokens, no drafts, 1 emitted); a mid-prefill row (nothing).
    got = num_valid_tokens(
        np.asarray([4, 6, 8], dtype=np.int32),
        np.asarray([3, 0, 0], dtype=np.int32),
        [[11, 12, 13], [14], []],
    )
    assert got.tolist() == [3, 6, 8]
