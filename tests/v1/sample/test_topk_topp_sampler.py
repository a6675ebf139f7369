"""Top-k / top-p / min-p filtering against transformers' logits warpers, and
the exponential-race sampler's distribution."""

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_only, apply_top_k_top_p, random_sample
from vllm.v1.sample.sampler import Sampler

VOCAB = 257
BATCH = 6


@pytest.fixture
def logits() -> torch.Tensor:
    gen = torch.Generator().manual_seed(1234)
    return torch.randn(BATCH, VOCAB, generator=gen) * 3


def _reference(logits: torch.Tensor, warpers_per_row: list[list]) -> torch.Tensor:
    """Apply transformers' warpers row by row (each row has its own params)."""
    rows = []
    for row, warpers in zip(logits, warpers_per_row):
        scores = row.unsqueeze(0).clone()
        for warper in warpers:
            scores = warper(None, scores)
        rows.append(scores[0])
    return torch.stack(rows)


def _assert_same_mask(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    kept = ~torch.isinf(ref)
    torch.testing.assert_close(ours[kept], ref[kept])


def test_top_k_matches_transformers(logits):
    ks = [1, 2, 10, 50, VOCAB, 3]
    k = torch.tensor(ks, dtype=torch.int32)
    ref = _reference(logits, [[TopKLogitsWarper(kk)] for kk in ks])
    _assert_same_mask(apply_top_k_top_p(logits.clone(), k, None), ref)
    # The sort-based path (used when top-p is also present) agrees too.
    no_p = torch.ones(BATCH)
    _assert_same_mask(apply_top_k_top_p(logits.clone(), k, no_p), ref)


def test_top_k_only_keeps_exactly_k_without_ties(logits):
    k = torch.tensor([1, 5, 7, 9, 11, 13])
    out = apply_top_k_only(logits.clone(), k)
    assert (~torch.isinf(out)).sum(-1).tolist() == k.tolist()


def test_top_p_matches_transformers(logits):
    ps = [0.1, 0.5, 0.9, 1.0, 0.99, 0.3]
    p = torch.tensor(ps)
    ref = _reference(logits, [[TopPLogitsWarper(pp)] if pp < 1.0 else [] for pp in ps])
    ours = apply_top_k_top_p(logits.clone(), None, p)
    _assert_same_mask(ours, ref)
    # p = 1.0 keeps the whole vocabulary.
    assert not torch.isinf(ours[3]).any()


def test_top_k_then_top_p_matches_transformers(logits):
    ks, ps = [5, VOCAB, 20, 1, 100, 40], [0.8, 0.5, 1.0, 0.9, 0.95, 0.2]
    k, p = torch.tensor(ks), torch.tensor(ps)
    warpers = []
    for kk, pp in zip(ks, ps):
        row = [TopKLogitsWarper(kk)] if kk < VOCAB else []
        row += [TopPLogitsWarper(pp)] if pp < 1.0 else []
        warpers.append(row)
    _assert_same_mask(apply_top_k_top_p(logits.clone(), k, p), _reference(logits, warpers))


def test_min_p_matches_transformers(logits):
    ps = [0.0, 0.05, 0.1, 0.5, 0.9, 1.0]
    min_p = torch.tensor(ps)
    ref = _reference(logits, [[MinPLogitsWarper(pp)] if pp > 0 else [] for pp in ps])
    _assert_same_mask(Sampler.apply_min_p(logits.clone(), min_p), ref)


def test_random_sample_follows_the_distribution():
    # 40k rows of the same 5-token distribution: empirical frequencies must
    # match within a few standard errors (std ~ 0.0025 here).
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])
    torch.manual_seed(0)
    tokens = random_sample(probs.repeat(40000, 1), generators={})
    freq = torch.bincount(tokens, minlength=5).float() / tokens.numel()
    torch.testing.assert_close(freq, probs, atol=0.012, rtol=0)
    assert freq[4] == 0


def test_random_sample_seeded_rows_use_their_generator():
    # The same seeded request at row 0 of one batch and row 3 of another, with
    # different batch-mates, draws the same 8 tokens in a row.
    probs = torch.softmax(torch.randn(4, 50), dim=-1)
    sequences = []
    for row in (0, 3):
        gen = torch.Generator().manual_seed(7)
        tokens = []
        for _ in range(8):
            batch = torch.softmax(torch.randn(4, 50), dim=-1)
            batch[row] = probs[1]
            tokens.append(random_sample(batch, {row: gen})[row].item())
        sequences.append(tokens)
    assert sequences[0] == sequences[1]
    assert len(set(sequences[0])) > 1  # it is really sampling


def _mask_of(out: torch.Tensor) -> torch.Tensor:
    return ~torch.isinf(out)


@pytest.mark.parametrize("scale", [0.3, 6.0])  # a flat and a peaked distribution
def test_top_p_candidates_path_equals_the_sort_path(scale):
    """The top-256-candidates path keeps exactly the tokens the full sort
    keeps, or declines (flat rows whose candidates hold less than p)."""
    from vllm.v1.sample.ops import topk_topp_sampler as ops

    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(8, 32000, generator=gen) * scale
    k = torch.tensor([32000, 5, 200, 32000, 100, 1, 32000, 40])
    p = torch.tensor([0.9, 0.8, 0.95, 1.0, 1.0, 0.5, 0.3, 0.99])
    for kk in (k, None):
        expected = ops._top_k_top_p_by_sort(logits.clone(), kk, p)
        fast = logits.clone()
        took = ops._top_k_top_p_from_candidates(fast, kk, p)
        if scale == 6.0:
            assert took  # peaked: every row's kept set is among the candidates
        if took:
            assert torch.equal(_mask_of(fast), _mask_of(expected))
            kept = _mask_of(expected)
            assert torch.equal(fast[kept], logits[kept])  # kept logits unchanged
        else:
            assert torch.equal(fast, logits)  # declined: untouched
        out = apply_top_k_top_p(logits.clone(), kk, p)
        assert torch.equal(_mask_of(out), _mask_of(expected))


def test_top_p_candidates_path_declines_what_it_cannot_decide():
    from vllm.v1.sample.ops import topk_topp_sampler as ops

    flat = torch.zeros(2, 1000)  # uniform: 256 candidates hold 0.256 < p
    p = torch.tensor([0.9, 0.9])
    assert not ops._top_k_top_p_from_candidates(flat.clone(), None, p)
    assert _mask_of(apply_top_k_top_p(flat.clone(), None, p)).sum(-1).tolist() == [900, 900]
    # A k-th value beyond the candidates, and ties at the k-th value past them.
    logits = torch.randn(2, 1000) * 3
    assert not ops._top_k_top_p_from_candidates(logits.clone(), torch.tensor([300, 5]), p)
    assert not ops._top_k_top_p_from_candidates(flat.clone(), torch.tensor([10, 10]), p)
    # All tied: top-k keeps every token, then top-p keeps 900 of them.
    assert _mask_of(apply_top_k_top_p(flat.clone(), torch.tensor([10, 10]), p)).sum(
        -1
    ).tolist() == [900, 900]
    # Only p = 1 and no top-k: the rows are left as they are.
    out = logits.clone()
    assert ops._top_k_top_p_from_candidates(out, None, torch.ones(2))
    assert torch.equal(out, logits)


def test_sync_free_sort_path_matches_transformers(logits):
    """What accelerators run (`_top_k_top_p_by_sort` for every k / p
    combination: no host reads), against transformers' warpers."""
    from vllm.v1.sample.ops.topk_topp_sampler import _top_k_top_p_by_sort

    ks, ps = [1, 2, 10, 50, VOCAB, 3], [0.1, 0.5, 0.9, 1.0, 0.99, 0.3]
    k, p = torch.tensor(ks, dtype=torch.int32), torch.tensor(ps)
    for args, warpers in (
        ((k, None), [[TopKLogitsWarper(kk)] for kk in ks]),
        ((None, p), [[TopPLogitsWarper(pp)] for pp in ps]),
        ((k, p), [[TopKLogitsWarper(kk), TopPLogitsWarper(pp)] for kk, pp in zip(ks, ps)]),
    ):
        _assert_same_mask(_top_k_top_p_by_sort(logits.clone(), *args), _reference(logits, warpers))
