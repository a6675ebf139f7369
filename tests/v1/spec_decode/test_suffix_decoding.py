"""Suffix decoding: SuffixDecodingProposer's drafts and request lifetimes over
arctic-inference's suffix trees (hand-checked drafts on token sequences whose
continuation is unambiguous), and SpeculativeConfig's suffix rules (the
library missing, field types, bounds, fields given to another method)."""

from __future__ import annotations

import importlib.util
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from vllm.config.speculative import SpeculativeConfig

HAS_ARCTIC = importlib.util.find_spec("arctic_inference") is not None
needs_arctic = pytest.mark.skipif(not HAS_ARCTIC, reason="arctic-inference is not installed")


class _Batch:
    """The InputBatch fields the proposer reads: rows of prompt + output ids."""

    def __init__(self, max_model_len: int = 64, rows: int = 4) -> None:
        self.token_ids_cpu = np.zeros((rows, max_model_len), dtype=np.int32)
        self.num_tokens_no_spec = np.zeros(rows, dtype=np.int32)
        self.num_prompt_tokens = np.zeros(rows, dtype=np.int32)
        self.req_ids: list[str] = []
        self.req_id_to_index: dict[str, int] = {}

    def add(self, req_id: str, prompt: list[int]) -> int:
        row = len(self.req_ids)
        self.req_ids.append(req_id)
        self.req_id_to_index[req_id] = row
        self.token_ids_cpu[row, : len(prompt)] = prompt
        self.num_tokens_no_spec[row] = self.num_prompt_tokens[row] = len(prompt)
        return row

    def append(self, row: int, tokens: list[int]) -> list[int]:
        n = int(self.num_tokens_no_spec[row])
        self.token_ids_cpu[row, n : n + len(tokens)] = tokens
        self.num_tokens_no_spec[row] += len(tokens)
        return tokens


def _proposer(k: int = 8, max_model_len: int = 64, **suffix):
    from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

    fields = {
        "suffix_decoding_max_tree_depth": 24,
        "suffix_decoding_max_cached_requests": 10000,
        "suffix_decoding_max_spec_factor": 1.0,
        "suffix_decoding_min_token_prob": 0.1,
    }
    fields.update({f"suffix_decoding_{name}": value for name, value in suffix.items()})
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k, **fields),
        model_config=SimpleNamespace(max_model_len=max_model_len),
    )
    return SuffixDecodingProposer(config)  # type: ignore[arg-type]


PROMPT = list(range(10, 20))


def _decode(proposer, batch: _Batch, row: int, tokens: list[int]) -> list[list[int]]:
    """Emit `tokens` one step at a time; the draft proposed after each."""
    k = proposer.num_speculative_tokens
    drafts = []
    for tok in tokens:
        sampled = [[] for _ in batch.req_ids]
        sampled[row] = batch.append(row, [tok])
        drafts.append(proposer.propose(k, batch, sampled)[row])
    return drafts


@needs_arctic
def test_draft_continues_the_prompt_up_to_the_match_length():
    # Output 10, 11, 12, 13 repeats the prompt's start: a suffix of length m
    # matches, and max_spec_factor=1 allows m tokens of its continuation.
    batch = _Batch()
    row = batch.add("a", PROMPT)
    got = _decode(_proposer(), batch, row, [10, 11, 12, 13])
    assert got == [[11], [12, 13], [13, 14, 15], [14, 15, 16, 17]]
    # num_speculative_tokens caps it; a larger factor lets a short match draft more.
    batch = _Batch()
    row = batch.add("a", PROMPT)
    assert _decode(_proposer(k=3), batch, row, [10, 11, 12, 13])[-1] == [14, 15, 16]
    batch = _Batch()
    row = batch.add("a", PROMPT)
    assert _decode(_proposer(max_spec_factor=3.0), batch, row, [10]) == [[11, 12, 13]]


@needs_arctic
def test_no_draft_mid_prefill_or_at_max_model_len():
    proposer = _proposer(max_model_len=16)
    batch = _Batch(max_model_len=16)
    row = batch.add("a", PROMPT)
    # Mid-prefill (nothing sampled): no draft and no tree yet.
    assert proposer.propose(8, batch, [[]]) == [[]]
    assert "a" not in proposer.suffix_cache.active_requests
    assert _decode(proposer, batch, row, [10, 11]) == [[11], [12, 13]]
    # n of 16 tokens: the drafts and the token sampled after them must fit,
    # so at most 16 - n - 1 (the match would allow 3, 4, 5, 6).
    assert _decode(proposer, batch, row, [12, 13, 14, 15]) == [[13, 14], [14], [], []]


@needs_arctic
def test_min_token_prob_stops_at_an_uncertain_token():
    # After 7, 1, 2 the prompt went on with 3, 4 and 5 (and the output once
    # with nothing yet): each continuation has probability 1/4.
    prompt = [7, 1, 2, 3, 7, 1, 2, 4, 7, 1, 2, 5]
    for min_prob, expect_draft in ((0.3, False), (0.2, True)):
        batch = _Batch()
        row = batch.add("a", prompt)
        drafts = _decode(_proposer(min_token_prob=min_prob), batch, row, [7, 1, 2])
        assert bool(drafts[-1]) == expect_draft, (min_prob, drafts)
        if expect_draft:
            assert drafts[-1][0] in (3, 4, 5)


@needs_arctic
def test_finished_requests_are_stopped_and_their_responses_reused():
    response = [301, 302, 303, 304, 305, 306]
    for max_cached, reused in ((10000, True), (0, False)):
        proposer = _proposer(max_cached_requests=max_cached)
        batch = _Batch()
        _decode(proposer, batch, batch.add("a", [1, 2, 3]), response)
        batch = _Batch()  # "a" left the batch
        row = batch.add("b", [4, 5, 6])
        drafts = _decode(proposer, batch, row, response[:3])
        cache = proposer.suffix_cache
        assert set(cache.active_requests) == {"b"}
        # b's output repeats a's response: the global tree drafts its rest.
        assert (drafts[-1] == [304, 305, 306]) == reused, drafts
        assert ("a" in cache.cached_requests) == reused


@needs_arctic
def test_cache_evicts_fifo_and_a_returning_request_starts_afresh():
    proposer = _proposer(max_cached_requests=2)
    for req_id in ("a", "b", "c"):
        batch = _Batch()
        _decode(proposer, batch, batch.add(req_id, [1, 2, 3]), [40, 41])
    assert set(proposer.suffix_cache.cached_requests) == {"b", "c"}
    # "c" comes back (a preempted request resumes under its id): its old
    # response is dropped and its tree restarts from the prompt.
    batch = _Batch()
    row = batch.add("c", [1, 2, 3])
    assert _decode(proposer, batch, row, [1]) == [[2]]
    assert set(proposer.suffix_cache.active_requests) == {"c"}


def test_missing_library_is_named_with_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "arctic_inference" else real(name, *a),
    )
    with pytest.raises(ImportError, match="Arctic Inference is required for suffix decoding") as e:
        SpeculativeConfig(method="suffix", num_speculative_tokens=2)
    assert "--no-build-isolation arctic-inference==0.3.0" in str(e.value)


def test_missing_library_at_drafter_build(monkeypatch):
    from vllm.v1.spec_decode.suffix_decoding import import_suffix_decoding_cache

    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding", None)
    with pytest.raises(ImportError, match="pip install nanobind==2.9.2"):
        import_suffix_decoding_cache()


@needs_arctic
def test_suffix_config_defaults_and_bounds():
    config = SpeculativeConfig(method="suffix", suffix_decoding_max_tree_depth=12)
    # num_speculative_tokens defaults to the tree depth (only a cap).
    assert config.num_speculative_tokens == 12
    assert "method='suffix', model=None" in repr(config)
    for field, value, match in (
        ("max_tree_depth", 0, "suffix_decoding_max_tree_depth=0 must be >= 1"),
        ("max_cached_requests", -1, "suffix_decoding_max_cached_requests=-1 must be >= 0"),
        ("max_spec_factor", -0.5, "suffix_decoding_max_spec_factor=-0.5 must be >= 0"),
        ("min_token_prob", 1.5, r"suffix_decoding_min_token_prob=1.5 must be in \[0, 1\]"),
        ("max_tree_depth", 2.5, "suffix_decoding_max_tree_depth must be an integer"),
        ("max_cached_requests", True, "suffix_decoding_max_cached_requests must be an integer"),
        ("min_token_prob", "x", "suffix_decoding_min_token_prob must be a number"),
    ):
        with pytest.raises(ValueError, match=match):
            SpeculativeConfig(method="suffix", **{f"suffix_decoding_{field}": value})


def test_suffix_fields_with_another_method_are_refused():
    with pytest.raises(ValueError, match="suffix_decoding_max_tree_depth=8 only applies to"):
        SpeculativeConfig(
            method="ngram", num_speculative_tokens=2, suffix_decoding_max_tree_depth=8
        )
    # Their defaults are fine (every config carries them).
    SpeculativeConfig(method="ngram", num_speculative_tokens=2, suffix_decoding_min_token_prob=0.1)
