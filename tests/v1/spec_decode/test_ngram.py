"""NgramProposer (prompt lookup): upstream's cases, a plain-Python reference on
random token arrays, bad numbers refused, and a timing print for a 4k prompt."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pytest

from vllm.config.scheduler import SchedulerConfig
from vllm.config.speculative import SpeculativeConfig
from vllm.v1.spec_decode.ngram_proposer import NgramProposer


@dataclass
class _ModelCfg:
    max_model_len: int


@dataclass
class _Cfg:
    """The three parts of a VllmConfig the proposer reads."""

    speculative_config: SpeculativeConfig | None
    model_config: _ModelCfg
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)


def _proposer(min_n: int, max_n: int, k: int, max_model_len: int = 1024) -> NgramProposer:
    spec = SpeculativeConfig(
        method="ngram", prompt_lookup_min=min_n, prompt_lookup_max=max_n, num_speculative_tokens=k
    )
    return NgramProposer(_Cfg(spec, _ModelCfg(max_model_len)))


def _one(tokens: list[int], min_n: int, max_n: int, k: int, max_model_len: int = 1024) -> list[int]:
    p = _proposer(min_n, max_n, k, max_model_len)
    return p.propose(k, [[0]], np.array([len(tokens)]), np.array([tokens], dtype=np.int64))[0]


def reference(tokens: list[int], min_n: int, max_n: int, k: int, max_model_len: int) -> list[int]:
    """The rule stated plainly: longest n first, then the earliest occurrence."""
    length = len(tokens)
    budget = min(k, max_model_len - length)
    if length < min_n or budget <= 0:
        return []
    for n in range(max_n, min_n - 1, -1):
        suffix = tokens[length - n :]
        for s in range(0, length - n):  # s + n <= length - 1: a token follows
            if tokens[s : s + n] == suffix:
                return tokens[s + n : s + n + budget]
    return []


def test_single_request_cases():
    # No 2-gram match ([5, 6] never occurred before).
    assert _one([1, 2, 3, 4, 1, 2, 3, 5, 6], 2, 2, 2) == []
    t = [1, 2, 3, 4, 1, 2, 3]
    assert _one(t, 2, 2, 3) == [4, 1, 2]
    assert _one(t, 2, 2, 2) == [4, 1]
    assert _one(t, 1, 1, 3) == [4, 1, 2]
    assert _one(t, 1, 1, 2) == [4, 1]
    t = [1, 3, 6, 2, 3, 4, 1, 2, 3]
    assert _one(t, 2, 2, 3) == [4, 1, 2]
    assert _one(t, 1, 1, 2) == [6, 2]  # the earliest "3" wins
    assert _one([1, 2, 3, 4, 5], 2, 2, 2) == []
    assert _one([1, 2, 3, 4, 1, 2, 3], 4, 4, 2) == []  # no 4-gram
    assert _one([1, 2, 3, 4, 1, 2, 3], 3, 4, 2) == [4, 1]  # 3-gram
    # Both 4- and 3-gram match: the 4-gram wins (not [5, 1]).
    assert _one([2, 3, 4, 5, 1, 2, 3, 4, 1, 2, 3, 4], 3, 4, 2) == [1, 2]
    # 3- and 2-gram match, not 4 (not [5, 2]).
    assert _one([3, 4, 5, 2, 3, 4, 1, 2, 3, 4], 2, 4, 2) == [1, 2]
    # Several 3-gram occurrences: the first one.
    assert _one([1, 2, 3, 100, 1, 2, 3, 200, 1, 2, 3, 300, 1, 2, 3], 3, 3, 2) == [100, 1]
    # An occurrence overlapping the suffix counts ([7, 7] at 0 and 1).
    assert _one([7, 7, 7], 2, 2, 3) == [7]


def test_k_truncated_at_context_end_and_max_model_len():
    t = [1, 2, 3, 9, 1, 2, 3]
    assert _one(t, 3, 3, 5) == [9, 1, 2, 3]  # only 4 tokens follow the match
    assert _one(t, 3, 3, 5, max_model_len=9) == [9, 1]  # 2 positions left
    assert _one(t, 3, 3, 5, max_model_len=8) == [9]
    assert _one(t, 3, 3, 5, max_model_len=7) == []  # at max_model_len: no draft


def test_batch_rows_padding_and_prefill_rows():
    # Rows padded with -1 beyond num_tokens_no_spec; row 1 is still in prefill.
    p = _proposer(2, 2, 2, max_model_len=20)
    tok = np.full((4, 20), -1, dtype=np.int32)
    tok[0, :5] = [1, 2, 3, 1, 2]
    tok[1, :5] = [4, 5, 6, 4, 5]
    tok[2, :5] = [7, 8, 9, 7, 8]
    tok[3, :3] = [4, 5, 6]
    out = p.propose(2, [[2], [], [8], [1]], np.array([5, 5, 5, 3]), tok)
    assert out == [[3, 1], [], [9, 7], []]
    assert p.valid_ngram_num_drafts[:4].tolist() == [2, 0, 2, 0]
    assert p.valid_ngram_draft[2, :2].tolist() == [9, 7]
    # Empty context.
    assert p.propose(2, [[0]], np.array([0]), np.zeros((1, 0), dtype=np.int64)) == [[]]
    # Fewer than k asked: num_speculative_tokens bounds the draft.
    assert p.propose(1, [[2]], np.array([5]), tok[:1]) == [[3]]


def test_long_context_match_in_the_middle():
    # Upstream's long multi-request case: a 2-gram whose only match is mid-prompt.
    n = 8192
    row0 = list(range(n)) + [n // 2, n // 2 + 1]
    row1 = [4, 5, 6] + [-1] * (len(row0) - 3)
    p = _proposer(2, 2, 2, max_model_len=2 * n)
    out = p.propose(2, [[0], [1]], np.array([len(row0), 3]), np.array([row0, row1]))
    assert out == [[n // 2 + 2, n // 2 + 3], []]


@pytest.mark.parametrize("seed", range(4))
def test_matches_reference_on_random_batches(seed: int):
    rng = np.random.default_rng(seed)
    for _ in range(25):
        min_n = int(rng.integers(1, 4))
        max_n = min_n + int(rng.integers(0, 4))
        k = int(rng.integers(1, 6))
        vocab = int(rng.integers(2, 6))  # small vocab: many (overlapping) matches
        max_model_len = int(rng.integers(1, 70))
        batch = int(rng.integers(1, 9))
        p = _proposer(min_n, max_n, k, max_model_len)
        tok = rng.integers(0, vocab, size=(batch, max_model_len)).astype(np.int32)
        lens = rng.integers(0, max_model_len + 1, size=batch)
        sampled = [[1] if rng.random() < 0.85 else [] for _ in range(batch)]
        out = p.propose(k, sampled, lens, tok)
        for i in range(batch):
            ctx = tok[i, : lens[i]].tolist()
            want = reference(ctx, min_n, max_n, k, max_model_len) if sampled[i] else []
            assert out[i] == want, (ctx, min_n, max_n, k, max_model_len)


def test_bad_numbers_refused():
    with pytest.raises(ValueError, match="prompt_lookup_min=3 must be <= prompt_lookup_max=2"):
        NgramProposer.from_params(3, 2, 2, 100)
    with pytest.raises(ValueError, match="prompt_lookup_min must be >= 1"):
        NgramProposer.from_params(0, 2, 2, 100)
    with pytest.raises(ValueError, match="num_speculative_tokens must be >= 1"):
        NgramProposer.from_params(1, 2, 0, 100)
    with pytest.raises(ValueError, match="speculative_config"):
        NgramProposer(_Cfg(None, _ModelCfg(100)))
    p = NgramProposer.from_params(1, 2, 2, 100)
    with pytest.raises(ValueError, match=r"num_speculative_tokens=3 must be in \[1, 2\]"):
        p.propose(3, [[1]], np.array([2]), np.array([[1, 1]]))


def test_timing_4k_prompt_print():
    """Not an assertion: how long one lookup over a 4k-token prompt takes here."""
    rng = np.random.default_rng(0)
    p = NgramProposer.from_params(3, 5, 5, 8192, max_num_seqs=64)
    tok = rng.integers(0, 32000, size=(64, 8192)).astype(np.int32)
    tok[:, 4090:4096] = tok[:, 100:106]  # a 6-token repeat ending the context
    for batch in (1, 64):
        lens = np.full(batch, 4096)
        p.propose(5, [[1]] * batch, lens, tok[:batch])  # warm-up
        t0 = time.perf_counter()
        reps = 20
        for _ in range(reps):
            out = p.propose(5, [[1]] * batch, lens, tok[:batch])
        ms = (time.perf_counter() - t0) / reps * 1e3
        assert out[0] == tok[0, 106:111].tolist()
        print(f"ngram propose: batch {batch} x 4096 tokens, max_n 5: {ms:.3f} ms")
