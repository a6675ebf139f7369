"""Model Runner V2 sampling: Gumbel-max with a stateless (seed, position)
stream, the per-request parameters, and top-k logprobs without a full softmax."""

import numpy as np
import pytest
import torch

from vllm.sampling_params import SamplingParams
from vllm.v1.worker.gpu.sample.gumbel import gumbel_noise, gumbel_sample, row_keys
from vllm.v1.worker.gpu.sample.logprob import compute_topk_logprobs
from vllm.v1.worker.gpu.sample.sampler import Sampler

CPU = torch.device("cpu")


def test_gumbel_max_draws_follow_the_softmax():
    # 20000 draws of one distribution (positions 0..19999 of one seeded request).
    probs = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.015, 0.005])
    n = 20000
    logits = probs.log().repeat(n, 1)
    rows = torch.zeros(n, dtype=torch.int64)
    tokens = gumbel_sample(logits, rows, torch.ones(1), torch.tensor([42]), torch.arange(n))
    freq = torch.bincount(tokens, minlength=8).float() / n
    sigma = (probs * (1 - probs) / n).sqrt()
    assert ((freq - probs).abs() < 5 * sigma + 1e-4).all(), (freq, probs)


def test_noise_is_finite_for_every_uniform_and_masks_hold():
    """Every one of the 2**23 uniforms gives finite noise (before the floor
    the 8 largest gave -inf: +inf on a finite logit, NaN on a masked one,
    and argmax picked the NaN), so a row with one finite logit always
    samples it (the grammar / min_tokens / bad_words masks rely on that)."""
    from vllm.v1.worker.gpu.sample.gumbel import log_neg_log_u_

    k_half = torch.arange(2**23, dtype=torch.float32) + 0.5
    noise = log_neg_log_u_(k_half)
    assert torch.isfinite(noise).all()
    # Monotone in k (U grows, -log U shrinks) up to the floor.
    assert (noise[1:] <= noise[:-1]).all()
    # 20000 rows of 512 with one allowed token each: before the floor about
    # 9 of them picked a masked token (4.4e-4 per row).
    n, vocab = 20000, 512
    allowed = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(0))
    logits = torch.full((n, vocab), float("-inf"))
    logits[torch.arange(n), allowed] = 0.0
    with torch.inference_mode():  # as the runner (the workspaces are inference tensors)
        tokens = gumbel_sample(
            logits,
            torch.arange(n),
            torch.ones(n),
            torch.arange(n),
            torch.zeros(n, dtype=torch.int64),
        )
    assert torch.equal(tokens, allowed)


def test_noise_is_uniform_gumbel_and_keyed_by_seed_and_position():
    keys = row_keys(torch.tensor([7, 7, 8]), torch.tensor([3, 4, 3]))
    assert len(set(keys.tolist())) == 3
    noise = gumbel_noise(keys, 50000)
    # Standard Gumbel: mean = Euler-Mascheroni constant, variance = pi^2 / 6.
    for row in noise:
        assert abs(row.mean().item() - 0.5772) < 0.03
        assert abs(row.var().item() - np.pi**2 / 6) < 0.06
    # Different (seed, pos) -> unrelated noise; same key -> the same noise.
    assert abs(np.corrcoef(noise[0], noise[1])[0, 1]) < 0.02
    assert torch.equal(gumbel_noise(keys[:1], 50000)[0], noise[0])


def test_a_row_draws_the_same_token_wherever_it_sits_in_the_batch():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 300, generator=g)
    temperature = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    seeds = torch.tensor([11, 12, 13, 14, 15, 16])
    rows, pos = torch.arange(6), torch.tensor([5, 9, 2, 5, 0, 31])
    full = gumbel_sample(logits, rows, temperature, seeds, pos)
    assert full[2] == logits[2].argmax()  # temperature 0: greedy
    perm = torch.tensor([4, 0, 5, 2])
    sub = gumbel_sample(logits[perm], rows[perm], temperature, seeds, pos[perm])
    assert torch.equal(sub, full[perm])
    # Another position of the same request draws other noise.
    moved = gumbel_sample(logits, rows, temperature, seeds, pos + 1)
    assert not torch.equal(moved[temperature != 0], full[temperature != 0])


def test_topk_logprobs_match_log_softmax():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 40, generator=g)
    logits[0, :3] = 2.5  # ties with the sampled token count as above it
    sampled = torch.tensor([1, 7, 0, 39, 20])
    out = compute_topk_logprobs(logits, 3, sampled)
    ref = logits.log_softmax(-1)
    assert torch.equal(out.logprob_token_ids[:, 0], sampled)
    assert torch.equal(out.logprob_token_ids[:, 1:], ref.topk(3).indices)
    torch.testing.assert_close(out.logprobs, ref.gather(1, out.logprob_token_ids))
    want_ranks = (ref >= ref.gather(1, sampled[:, None])).sum(-1)
    assert torch.equal(out.selected_token_ranks, want_ranks)
    assert out.selected_token_ranks[0] == 3
    sampled_only = compute_topk_logprobs(logits, 0, sampled)
    assert sampled_only.logprobs.shape == (5, 1)


def make_sampler(params: list[SamplingParams], vocab: int = 64, **kwargs) -> Sampler:
    sampler = Sampler(max_num_reqs=8, vocab_size=vocab, device=CPU, **kwargs)
    for row, p in enumerate(params):
        sampler.add_request(row, 0, p)
    sampler.apply_staged_writes()
    return sampler


def run(sampler: Sampler, logits: torch.Tensor, rows: list[int], pos: list[int]):
    idx_np = np.array(rows, dtype=np.int64)
    return sampler(logits.clone(), torch.from_numpy(idx_np), idx_np, torch.tensor(pos))


def test_sampler_parameters():
    vocab = 64
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(4, vocab, generator=g) * 3
    argmax = logits.argmax(-1)
    # Each of these leaves only the most likely token.
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.5, top_k=1),
        SamplingParams(temperature=1.5, top_p=1e-6),
        SamplingParams(temperature=1.5, min_p=1.0),
    ]
    sampler = make_sampler(params)
    for pos in range(5):
        out = run(sampler, logits, [0, 1, 2, 3], [pos] * 4)
        assert torch.equal(out.sampled_token_ids[:, 0], argmax)
        assert out.logprobs_tensors is None
    # Without the filters, temperature 1.5 does move off the argmax.
    free = make_sampler([SamplingParams(temperature=1.5, seed=s) for s in range(4)])
    draws = torch.stack(
        [run(free, logits, [0, 1, 2, 3], [p] * 4).sampled_token_ids[:, 0] for p in range(10)]
    )
    assert (draws != argmax).any()


def test_top_k_keeps_draws_inside_the_top_k():
    logits = torch.arange(32, dtype=torch.float32).repeat(3, 1) / 8
    sampler = make_sampler(
        [SamplingParams(temperature=2.0, top_k=3, seed=s) for s in range(3)], vocab=32
    )
    draws = torch.cat(
        [run(sampler, logits, [0, 1, 2], [p] * 3).sampled_token_ids[:, 0] for p in range(30)]
    )
    assert set(draws.tolist()) == {29, 30, 31}


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs", "raw_logits"])
def test_logprobs_modes(mode):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 64, generator=g)
    sampler = make_sampler(
        [
            SamplingParams(temperature=0.5, logprobs=2, seed=1),
            SamplingParams(temperature=0.0, logprobs=4),
        ],
        logprobs_mode=mode,
    )
    out = run(sampler, logits, [0, 1], [0, 0])
    lp = out.logprobs_tensors
    assert lp.logprob_token_ids.shape == (2, 5)  # sampled + the batch's max of 4
    assert torch.equal(lp.logprob_token_ids[:, 0], out.sampled_token_ids[:, 0])
    ids = lp.logprob_token_ids
    if mode == "raw_logprobs":
        torch.testing.assert_close(lp.logprobs, logits.log_softmax(-1).gather(1, ids))
    elif mode == "raw_logits":
        torch.testing.assert_close(lp.logprobs, logits.gather(1, ids))
    else:  # after temperature: row 0 is divided by 0.5
        scaled = logits / torch.tensor([[0.5], [1.0]])
        torch.testing.assert_close(lp.logprobs, scaled.log_softmax(-1).gather(1, ids))
    with pytest.raises(ValueError, match="logprobs_mode"):
        Sampler(4, 64, CPU, logprobs_mode="nope")


def test_unseeded_requests_draw_reproducible_distinct_seeds():
    params = [SamplingParams(temperature=1.0)] * 3 + [SamplingParams(temperature=1.0, seed=5)]
    a, b = make_sampler(params, seed=0), make_sampler(params, seed=0)
    seeds = a.sampling_states.seeds.np[:4]
    assert np.array_equal(seeds, b.sampling_states.seeds.np[:4])
    assert len(set(seeds[:3].tolist())) == 3 and seeds[3] == 5
    assert not np.array_equal(seeds[:3], make_sampler(params, seed=1).sampling_states.seeds.np[:3])


@pytest.mark.parametrize("vocab", [100, 512, 513, 32000, 32001])
def test_blockwise_argmax_equals_torch_argmax(vocab):
    from vllm.v1.worker.gpu.sample.greedy_argmax import argmax_rows

    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(12, vocab, generator=g)
    x[0] = 1.0  # all tied: index 0
    x[1, -1] = 50.0  # the maximum in the ragged tail block
    x[2] = float("-inf")
    x[2, vocab // 2] = 0.0
    x[3, 5] = x[3, vocab - 3] = 60.0  # tie across blocks: the first one
    ties = torch.randint(0, 4, (8, vocab), generator=g).float()
    for t in (x, ties, x[:, : vocab - 1]):  # the last: rows with a stride > vocab
        assert torch.equal(argmax_rows(t), t.argmax(dim=-1))
        for i in range(4):  # one row: its own path
            assert torch.equal(argmax_rows(t[i : i + 1]), t[i : i + 1].argmax(dim=-1))
    out = torch.empty(12, dtype=torch.int64)
    argmax_rows(x, out=out)
    assert torch.equal(out, x.argmax(dim=-1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [513, 49152])
def test_blockwise_argmax_half_precision(dtype, vocab):
    """Half-precision logits (the model's dtype), many rows (blockwise) and
    one row (widened to float32): torch's argmax of the half values, ties
    (which rounding to half makes common) and NaN included."""
    from vllm.v1.worker.gpu.sample.greedy_argmax import argmax_rows

    g = torch.Generator().manual_seed(vocab)
    x = (torch.randn(6, vocab, generator=g) * 4).to(dtype)
    x[1, 7] = x[1, vocab - 2] = 100.0  # tie across blocks: the first one
    x[2, vocab // 3] = float("nan")  # NaN wins, as in torch.argmax
    x[3] = float("-inf")
    x[3, -1] = 0.0
    for t in (x, x[:, : vocab - 1]):
        assert torch.equal(argmax_rows(t), t.argmax(dim=-1))
        for i in range(len(t)):
            assert torch.equal(argmax_rows(t[i : i + 1]), t[i : i + 1].argmax(dim=-1))
    assert argmax_rows(x)[2] == argmax_rows(x[2:3])[0] == vocab // 3
    one = torch.empty(1, dtype=torch.int64)
    argmax_rows(x[1:2], out=one)
    assert one.item() == 7
    out = torch.empty(6, dtype=torch.int64)
    argmax_rows(x, out=out)
    assert torch.equal(out, x.argmax(dim=-1))
