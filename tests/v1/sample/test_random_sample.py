"""Inverse-CDF random sampling (vllm/v1/sample/ops/topk_topp_sampler.py):
the draw follows the distribution, never returns a zero-probability token,
and seeded rows do not depend on their batch-mates."""

import pytest
import torch

from tests.v1.sample.test_sampler import make_metadata
from vllm.v1.sample.ops.topk_topp_sampler import (
    _CDF_BLOCK,
    inverse_cdf_sample,
    random_sample,
    replace_zero_prob_tokens,
)
from vllm.v1.sample.sampler import Sampler

# The largest float64 below 1: the top of uniform_()'s range [0, 1).
U_MAX = 1.0 - 2.0**-53
# Ten tokens, one of them impossible.
TEN_WAY = torch.tensor([0.3, 0.2, 0.15, 0.1, 0.08, 0.07, 0.05, 0.03, 0.02, 0.0])


def chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's statistic over the categories with p > 0 (8 degrees of
    freedom for TEN_WAY)."""
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    expected = probs.double() * tokens.numel()
    live = expected > 0
    return float(((counts[live] - expected[live]) ** 2 / expected[live]).sum())


# Under a correct sampler P(chi2_8 > 45) ~ 4e-7, and the seed is fixed, so this
# cannot flake; a sampler off by one token scores in the thousands (checked by
# shifting the returned index by one).
CHI2_LIMIT = 45.0
DRAWS = 20000


def test_unseeded_draws_follow_the_distribution():
    torch.manual_seed(0)
    tokens = random_sample(TEN_WAY.repeat(DRAWS, 1), generators={})
    assert chi_square(tokens, TEN_WAY) < CHI2_LIMIT
    assert not (tokens == 9).any()


def test_seeded_draws_follow_the_distribution():
    # Every row seeded, all from one generator (one uniform per row, in row
    # order): the per-request streams must give a fair sampler too.
    gen = torch.Generator().manual_seed(1234)
    tokens = random_sample(TEN_WAY.repeat(DRAWS, 1), {row: gen for row in range(DRAWS)})
    assert chi_square(tokens, TEN_WAY) < CHI2_LIMIT


def test_wrong_distribution_is_rejected():
    # The statistic has power: draws from a shifted distribution fail the bound.
    torch.manual_seed(0)
    tokens = random_sample(TEN_WAY.roll(1).repeat(DRAWS, 1), generators={})
    assert chi_square(tokens, TEN_WAY) > 10 * CHI2_LIMIT


def test_unnormalised_rows_and_a_long_vocab():
    # Rows need not sum to 1, and a vocabulary that spans many blocks plus a
    # short last block samples the right mass from each region.
    vocab = 5 * _CDF_BLOCK + 37
    probs = torch.zeros(vocab)
    probs[3], probs[_CDF_BLOCK], probs[3 * _CDF_BLOCK - 1], probs[vocab - 1] = 2.0, 1.0, 0.5, 0.5
    torch.manual_seed(1)
    tokens = random_sample(probs.repeat(DRAWS, 1), generators={})
    counts = torch.bincount(tokens, minlength=vocab)
    assert counts.sum() == counts[[3, _CDF_BLOCK, 3 * _CDF_BLOCK - 1, vocab - 1]].sum()
    expected = torch.tensor([0.5, 0.25, 0.125, 0.125]) * DRAWS
    got = counts[[3, _CDF_BLOCK, 3 * _CDF_BLOCK - 1, vocab - 1]].double()
    assert float(((got - expected) ** 2 / expected).sum()) < 35.0  # 3 dof: p ~ 1e-7


@pytest.mark.parametrize("vocab", [1, 7, _CDF_BLOCK, _CDF_BLOCK + 1, 3 * _CDF_BLOCK + 5])
def test_one_hot_rows_always_return_their_token(vocab):
    # Every position (first, last, either side of a block boundary) as the
    # only token, at the extremes of the uniform and in between.
    positions = sorted(
        {0, vocab - 1, min(_CDF_BLOCK - 1, vocab - 1), min(_CDF_BLOCK, vocab - 1), vocab // 2}
    )
    probs = torch.zeros(len(positions), vocab)
    probs[torch.arange(len(positions)), torch.tensor(positions)] = 1.0
    for u in (0.0, 1e-300, 0.5, U_MAX):
        uu = torch.full((len(positions), 1), u, dtype=torch.float64)
        assert inverse_cdf_sample(probs, uu).tolist() == positions


def test_zero_probability_tokens_are_never_returned():
    # Random rows with about two thirds of the vocabulary masked out, leading
    # and trailing zeros and whole zero blocks, at the uniform's extremes (which
    # land exactly on cdf boundaries) and at random values.
    gen = torch.Generator().manual_seed(5)
    vocab = 4 * _CDF_BLOCK + 100
    probs = torch.rand(64, vocab, generator=gen)
    probs[torch.rand(64, vocab, generator=gen) < 0.67] = 0.0
    probs[:, :300] = 0.0
    probs[:, -150:] = 0.0
    probs[:, 2 * _CDF_BLOCK : 3 * _CDF_BLOCK] = 0.0
    probs[0, 1000] = 1e-30  # a lone, tiny survivor
    probs[0, 300:1000] = 0.0
    probs[0, 1001:] = 0.0
    uniforms = [
        torch.zeros(64, 1, dtype=torch.float64),
        torch.full((64, 1), U_MAX, dtype=torch.float64),
    ]
    uniforms += [torch.rand(64, 1, dtype=torch.float64, generator=gen) for _ in range(200)]
    for u in uniforms:
        tokens = inverse_cdf_sample(probs, u)
        assert (probs.gather(1, tokens.unsqueeze(1)) > 0).all()
    assert inverse_cdf_sample(probs[:1], uniforms[1][:1]).item() == 1000


def test_matches_a_single_level_float64_search():
    # The two-level search returns what one search over the full float64 cdf
    # returns, except where u * total falls within rounding of a boundary.
    gen = torch.Generator().manual_seed(11)
    probs = torch.softmax(torch.randn(256, 3000, generator=gen) * 3, dim=-1)
    u = torch.rand(256, 1, dtype=torch.float64, generator=gen)
    cdf = probs.double().cumsum(-1)
    target = u * cdf[:, -1:]
    reference = torch.searchsorted(cdf, target, right=True).view(-1)
    ours = inverse_cdf_sample(probs, u)
    differ = ours != reference
    gap = (cdf.gather(1, reference.unsqueeze(1)) - target).abs().view(-1)
    assert (gap[differ] < 1e-12).all()
    assert differ.sum() <= 2


def test_probs_are_left_unchanged_and_empty_batch():
    probs = torch.softmax(torch.randn(3, 40), dim=-1)
    before = probs.clone()
    random_sample(probs, {1: torch.Generator().manual_seed(0)})
    assert torch.equal(probs, before)
    assert random_sample(torch.zeros(0, 40), {}).shape == (0,)


def test_replace_zero_prob_tokens():
    # The guard used off CPU: a token with zero probability becomes the mode.
    probs = torch.tensor([[0.0, 0.7, 0.3], [0.2, 0.0, 0.8], [0.5, 0.5, 0.0]])
    token = torch.tensor([[0], [2], [2]])
    assert replace_zero_prob_tokens(probs, token).view(-1).tolist() == [1, 2, 0]


def _sampler_tokens(seed_row: int, batch: int, step_seed: int, gen: torch.Generator) -> int:
    """One step of the full Sampler (top-p, a greedy batch-mate) with a seeded
    request at `seed_row` among unseeded ones; returns the seeded row's token."""
    logits = torch.randn(batch, 500, generator=torch.Generator().manual_seed(step_seed)) * 3
    logits[seed_row] = torch.randn(500, generator=torch.Generator().manual_seed(7)) * 3
    temps = [1.0] * batch
    temps[(seed_row + 1) % batch] = 0.0 if batch > 1 else 1.0
    top_p = [0.95] * batch
    meta = make_metadata(temps, top_p=top_p, generators={seed_row: gen})
    return int(Sampler()(logits, meta).sampled_token_ids[seed_row, 0])


def test_seeded_request_is_independent_of_its_batch():
    runs = []
    for seed_row, batch in ((0, 1), (2, 5), (6, 7)):
        gen = torch.Generator().manual_seed(2024)
        torch.manual_seed(seed_row + batch)  # batch-mates draw differently each run
        runs.append([_sampler_tokens(seed_row, batch, 100 * batch + s, gen) for s in range(10)])
    assert runs[0] == runs[1] == runs[2]
    assert len(set(runs[0])) > 1


def test_unseeded_rows_follow_the_default_generator():
    probs = torch.softmax(torch.randn(16, 300), dim=-1)
    torch.manual_seed(3)
    first = random_sample(probs, {})
    torch.manual_seed(3)
    assert torch.equal(random_sample(probs, {}), first)
    # A seeded batch-mate neither consumes nor perturbs the default stream.
    torch.manual_seed(3)
    mixed = random_sample(probs, {5: torch.Generator().manual_seed(9)})
    keep = torch.arange(16) != 5
    assert torch.equal(mixed[keep], first[keep])
