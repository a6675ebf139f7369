"""Sampler: greedy, temperature, seeded sampling and logprobs."""

import pytest
import torch

from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.sampler import Sampler

VOCAB = 64


def make_metadata(
    temperatures: list[float],
    *,
    top_k=None,
    top_p=None,
    min_p=None,
    generators=None,
    max_num_logprobs=None,
) -> SamplingMetadata:
    greedy = [t < 1e-5 for t in temperatures]
    return SamplingMetadata(
        temperature=None if all(greedy) else torch.tensor(temperatures),
        all_greedy=all(greedy),
        all_random=not any(greedy),
        top_p=None if top_p is None else torch.tensor(top_p),
        top_k=None if top_k is None else torch.tensor(top_k, dtype=torch.int32),
        min_p=None if min_p is None else torch.tensor(min_p),
        generators=generators or {},
        max_num_logprobs=max_num_logprobs,
    )


def random_logits(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(seed)) * 4


def test_greedy_is_argmax():
    logits = random_logits(5)
    out = Sampler()(logits.clone(), make_metadata([0.0] * 5))
    assert out.sampled_token_ids.shape == (5, 1)
    assert out.sampled_token_ids.dtype == torch.int32
    assert out.sampled_token_ids[:, 0].tolist() == logits.argmax(-1).tolist()
    assert out.logprobs_tensors is None


def test_mixed_batch_greedy_rows_stay_argmax():
    logits = random_logits(6)
    temps = [0.0, 1.0, 0.0, 2.0, 0.0, 1.5]
    for seed in range(5):
        torch.manual_seed(seed)
        tokens = Sampler()(logits.clone(), make_metadata(temps)).sampled_token_ids[:, 0]
        for row in (0, 2, 4):
            assert tokens[row] == logits[row].argmax()


def test_bf16_logits_are_sampled_in_float32():
    logits = random_logits(3).to(torch.bfloat16)
    out = Sampler()(logits, make_metadata([0.0] * 3, max_num_logprobs=2))
    assert out.logprobs_tensors.logprobs.dtype == torch.float32


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_temperature_scales_the_distribution(temperature):
    # One 4-token distribution repeated over 40k rows: the sampled frequencies
    # must match softmax(logits / T).
    base = torch.tensor([2.0, 1.0, 0.5, -1.0])
    n = 40000
    torch.manual_seed(0)
    tokens = Sampler()(base.repeat(n, 1), make_metadata([temperature] * n)).sampled_token_ids
    freq = torch.bincount(tokens[:, 0].long(), minlength=4).float() / n
    torch.testing.assert_close(freq, torch.softmax(base / temperature, -1), atol=0.012, rtol=0)


def test_top_k_one_is_argmax_even_when_random():
    logits = random_logits(4)
    meta = make_metadata([1.0] * 4, top_k=[1] * 4)
    tokens = Sampler()(logits.clone(), meta).sampled_token_ids[:, 0]
    assert tokens.tolist() == logits.argmax(-1).tolist()


def test_sampled_tokens_respect_top_p_and_min_p():
    logits = random_logits(4, seed=3)
    probs = logits.softmax(-1)
    for seed in range(10):
        torch.manual_seed(seed)
        meta = make_metadata([1.0] * 4, top_p=[0.3, 1.0, 0.3, 1.0], min_p=[0.0, 0.5, 0.0, 0.5])
        tokens = Sampler()(logits.clone(), meta).sampled_token_ids[:, 0]
        for row in (1, 3):  # min-p 0.5: only tokens with p >= 0.5 * max
            assert probs[row, tokens[row]] >= 0.5 * probs[row].max()
        for row in (0, 2):  # top-p 0.3: the token is within the top-0.3 nucleus
            sorted_probs, order = probs[row].sort(descending=True)
            rank = (order == tokens[row]).nonzero().item()
            assert sorted_probs[:rank].sum() < 0.3


def _seeded_run(row: int, batch_size: int, steps: int = 6) -> list[int]:
    """Sample `steps` tokens for a seeded request sitting at `row`, surrounded by
    unseeded random requests with different logits each time."""
    target = random_logits(1, seed=99)
    gen = torch.Generator().manual_seed(42)
    out = []
    for step in range(steps):
        logits = random_logits(batch_size, seed=1000 + step + batch_size)
        logits[row] = target[0]
        meta = make_metadata(
            [0.8] * batch_size, top_k=[VOCAB // 2] * batch_size, generators={row: gen}
        )
        out.append(Sampler()(logits, meta).sampled_token_ids[row, 0].item())
    return out


def test_seeded_sampling_is_reproducible_and_independent_of_batch():
    alone = _seeded_run(row=0, batch_size=1)
    assert alone == _seeded_run(row=0, batch_size=1)
    assert alone == _seeded_run(row=2, batch_size=5)
    assert alone == _seeded_run(row=6, batch_size=7)
    assert len(set(alone)) > 1


def test_logprobs_top_k_and_rank():
    logits = random_logits(3)
    temps = [0.0, 0.0, 0.0]
    out = Sampler()(logits.clone(), make_metadata(temps, max_num_logprobs=3))
    lp = out.logprobs_tensors
    ref = torch.log_softmax(logits, -1)
    assert lp.logprob_token_ids.shape == (3, 4)
    # Column 0: the sampled (argmax) token, rank 1.
    assert lp.logprob_token_ids[:, 0].tolist() == logits.argmax(-1).tolist()
    assert lp.selected_token_ranks.tolist() == [1, 1, 1]
    top = ref.topk(3, dim=-1)
    assert lp.logprob_token_ids[:, 1:].tolist() == top.indices.tolist()
    torch.testing.assert_close(lp.logprobs[:, 1:], top.values)
    torch.testing.assert_close(lp.logprobs[:, 0], ref.max(-1).values)


def test_logprob_rank_of_a_random_token():
    logits = random_logits(8)
    torch.manual_seed(0)
    out = Sampler()(logits.clone(), make_metadata([5.0] * 8, max_num_logprobs=0))
    lp = out.logprobs_tensors
    ref = torch.log_softmax(logits, -1)  # raw logprobs: before temperature
    tokens = out.sampled_token_ids[:, 0].long()
    assert lp.logprob_token_ids.shape == (8, 1)
    torch.testing.assert_close(lp.logprobs[:, 0], ref.gather(1, tokens[:, None])[:, 0])
    expected_ranks = (ref > ref.gather(1, tokens[:, None])).sum(-1) + 1
    assert lp.selected_token_ranks.tolist() == expected_ranks.tolist()


def test_processed_logprobs_see_the_filtering():
    logits = random_logits(2)
    meta = make_metadata([1.0, 1.0], top_k=[2, 2], max_num_logprobs=3)
    out = Sampler(logprobs_mode="processed_logprobs")(logits.clone(), meta)
    # Only two tokens survive top-k: the third reported logprob is -inf and the
    # two kept ones renormalise to probability 1.
    values = out.logprobs_tensors.logprobs[:, 1:]
    assert torch.isinf(values[:, 2]).all()
    torch.testing.assert_close(values[:, :2].exp().sum(-1), torch.ones(2))


def test_full_vocab_logprobs():
    logits = random_logits(2)
    out = Sampler()(logits.clone(), make_metadata([0.0, 0.0], max_num_logprobs=-1))
    assert out.logprobs_tensors.logprobs.shape == (2, VOCAB + 1)


def test_unknown_logprobs_mode_is_rejected():
    with pytest.raises(ValueError):
        Sampler(logprobs_mode="probs")
