"""RejectionSampler: upstream's greedy cases, then the random-sampling
guarantee (every emitted token is distributed as the target) checked by a
chi-square test that also catches a broken sampler."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

import vllm.v1.sample.rejection_sampler as rs
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID, RejectionSampler
from vllm.v1.sample.sampler import Sampler
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

P = PLACEHOLDER_TOKEN_ID
CPU = torch.device("cpu")
VOCAB = 100


@pytest.fixture(scope="module")
def sampler() -> RejectionSampler:
    return RejectionSampler(Sampler())


def greedy_md(n: int = 0, **kw) -> SamplingMetadata:
    return SamplingMetadata(
        temperature=None, all_greedy=True, all_random=False, top_p=None, top_k=None,
        min_p=None, generators={}, max_num_logprobs=None, **kw,
    )  # fmt: skip


def random_md(temps: list[float], generators=None, **kw) -> SamplingMetadata:
    greedy = [t < 1e-5 for t in temps]
    fields = dict(top_p=None, top_k=None, min_p=None, max_num_logprobs=None) | kw
    return SamplingMetadata(
        temperature=torch.tensor(temps), all_greedy=all(greedy), all_random=not any(greedy),
        generators=generators or {}, **fields,
    )  # fmt: skip


def peaked_logits(output_tokens: list[list[int]]) -> torch.Tensor:
    """One row per draft position and bonus position, request by request
    (make_dummy's layout), peaked at the given token."""
    rows = [tok for toks in output_tokens for tok in toks]
    logits = torch.full((len(rows), VOCAB), -100.0)
    logits[torch.arange(len(rows)), torch.tensor(rows)] = 100.0
    return logits


@pytest.mark.parametrize(
    "spec,target,expected",
    [
        ([[1, 2, 3]], [[1, 2, 3, 4]], [[1, 2, 3, 4]]),  # all accepted + bonus
        ([[1, 2, 3]], [[1, 5, 3, 4]], [[1, 5, P, P]]),  # early rejection
        ([[1, 2], [3]], [[1, 2, 5], [3, 4]], [[1, 2, 5], [3, 4, P]]),  # mixed lengths
        ([[1]], [[1, 2]], [[1, 2]]),
        ([[]], [[5]], [[5]]),  # empty drafts: bonus only
        ([[1, 2, 3], [4, 5, 6]], [[1, 2, 7, 6], [4, 8, 6, 9]], [[1, 2, 7, P], [4, 8, P, P]]),
        ([[1]], [[2, 3]], [[2, P]]),  # first mismatch
        ([[], [1, 2]], [[7], [1, 2, 9]], [[7, P, P], [1, 2, 9]]),  # one request without drafts
    ],
)
def test_greedy(sampler, spec, target, expected):
    meta = SpecDecodeMetadata.make_dummy(spec, CPU)
    out = sampler(meta, None, peaked_logits(target), greedy_md())
    assert out.sampled_token_ids.dtype == torch.int32
    assert out.sampled_token_ids.tolist() == expected
    tokens, _ = RejectionSampler.parse_output(out.sampled_token_ids, VOCAB)
    assert tokens == [[t for t in row if t != P] for row in expected]


def test_parse_output_discards_and_filters_out_of_vocab():
    out = torch.tensor([[1, 2, P], [3, VOCAB + 1, P], [4, 5, 6]], dtype=torch.int32)
    tokens, _ = RejectionSampler.parse_output(out, VOCAB, discard_req_indices=[2])
    assert tokens == [[1, 2], [3], []]


def test_bad_words_see_the_earlier_drafts(sampler):
    # Bad word [1, 2]: after the draft 1, token 2 is banned at position 1, so
    # the target's runner-up 3 is emitted there.
    meta = SpecDecodeMetadata.make_dummy([[1, 2]], CPU)
    logits = peaked_logits([[1, 2, 4]])
    logits[1, 3] = 99.0
    md = greedy_md(bad_words_token_ids={0: [[1, 2]]}, output_token_ids=[[9]])
    assert sampler(meta, None, logits.clone(), md).sampled_token_ids.tolist() == [[1, 3, P]]
    # Without the bad word the drafts are accepted.
    assert sampler(meta, None, logits.clone(), greedy_md()).sampled_token_ids.tolist() == [
        [1, 2, 4]
    ]


def test_frequency_penalty_counts_the_earlier_drafts(sampler):
    # Drafts [1, 1]: at position 1 the history holds the first 1, whose
    # penalty drops it below the runner-up 3.
    meta = SpecDecodeMetadata.make_dummy([[1, 1]], CPU)
    logits = peaked_logits([[1, 1, 4]])
    logits[1, 3] = 99.0
    md = greedy_md(
        no_penalties=False,
        prompt_token_ids=torch.tensor([[8, VOCAB]]),
        frequency_penalties=torch.tensor([300.0]),
        presence_penalties=torch.tensor([0.0]),
        repetition_penalties=torch.tensor([1.0]),
        output_token_ids=[[]],
    )
    assert sampler(meta, None, logits, md).sampled_token_ids.tolist() == [[1, 3, P]]


def test_allowed_token_ids_apply_to_every_draft_position(sampler):
    meta = SpecDecodeMetadata.make_dummy([[1, 2], [5]], CPU)
    logits = peaked_logits([[1, 2, 4], [5, 6]])
    logits[:, 7] = 99.0
    mask = torch.zeros(2, VOCAB, dtype=torch.bool)
    mask[0, 2] = True  # request 0 may not emit 2
    md = greedy_md(allowed_token_ids_mask=mask)
    assert sampler(meta, None, logits, md).sampled_token_ids.tolist() == [[1, 7, P], [5, 6, P]]


def test_mixed_greedy_and_random_rows(sampler):
    # Row 0 greedy (temperature -1, the input batch's greedy value), row 1 at
    # a very low temperature over peaked logits: both follow the target exactly.
    spec = [[1, 2], [3, 4]]
    target = [[1, 6, 7], [3, 4, 8]]
    meta = SpecDecodeMetadata.make_dummy(spec, CPU)
    out = sampler(meta, None, peaked_logits(target), random_md([-1.0, 0.01]))
    assert out.sampled_token_ids.tolist() == [[1, 6, P], [3, 4, 8]]


def test_raw_logprobs_of_the_emitted_tokens(sampler):
    spec, target = [[1, 2], [3]], [[1, 5, 6], [3, 4]]
    meta = SpecDecodeMetadata.make_dummy(spec, CPU)
    logits = peaked_logits(target) + torch.randn(5, VOCAB)
    md = greedy_md()
    md.max_num_logprobs = 2
    out = sampler(meta, None, logits.clone(), md)
    tokens, lp = RejectionSampler.parse_output(
        out.sampled_token_ids, VOCAB, logprobs_tensors=out.logprobs_tensors
    )
    assert tokens == [[1, 5], [3, 4]]
    assert lp is not None
    ref = logits.log_softmax(-1)
    rows = [0, 1, 3, 4]  # the logits row of each emitted token
    flat = [t for ts in tokens for t in ts]
    for i, (row, tok) in enumerate(zip(rows, flat)):
        assert lp.logprob_token_ids[i][0] == tok
        assert lp.logprobs[i][0] == pytest.approx(ref[row, tok].item(), abs=1e-5)
        assert lp.sampled_token_ranks[i] == 1
    # Per request: slice_request finds each request's positions.
    assert lp.cu_num_generated_tokens == [0, 2, 4]
    assert [x[0] for x in lp.slice_request(1, 2).logprob_token_ids] == [3, 4]
    # A stop after the first token of request 0 keeps its first logprob only.
    assert [x[0] for x in lp.slice_request(0, 1).logprob_token_ids] == [1]


def test_parse_output_logprobs_offsets_count_discarded_rows(sampler):
    # Request 0 is discarded (mid-prefill): its position still counts in the
    # offsets, so request 1's logprobs are found at its own row.
    spec, target = [[], [3, 5]], [[7], [3, 5, 6]]
    meta = SpecDecodeMetadata.make_dummy(spec, CPU)
    md = greedy_md()
    md.max_num_logprobs = 0
    out = sampler(meta, None, peaked_logits(target), md)
    tokens, lp = RejectionSampler.parse_output(
        out.sampled_token_ids, VOCAB, [0], logprobs_tensors=out.logprobs_tensors
    )
    assert tokens == [[], [3, 5, 6]]
    assert lp is not None and lp.cu_num_generated_tokens == [0, 1, 4]
    assert [x[0] for x in lp.slice_request(1, 3).logprob_token_ids] == [3, 5, 6]


# ---- random sampling: the output distribution is the target's ----------------

V, K, N = 6, 2, 20000  # small vocabulary, 2 drafts per request, draws


def distributions(seed: int):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(K + 1, V, generator=g)  # logits at positions 0, 1 and the bonus
    draft = torch.softmax(torch.randn(K, V, generator=g), -1)
    return target, draft


def run_many(sampler, with_draft_probs: bool, seed: int = 0) -> torch.Tensor:
    """N requests, all with the same target/draft distributions per position
    and drafts drawn from the draft distribution. Returns [N, K + 1]."""
    target, draft = distributions(seed)
    g = torch.Generator().manual_seed(seed + 1)
    drafts = torch.stack([torch.multinomial(draft[k], N, True, generator=g) for k in range(K)], 1)
    meta = SpecDecodeMetadata.make_dummy(drafts.tolist(), CPU)
    logits = target.repeat(N, 1)  # rows: request by request, K drafts then bonus
    draft_probs = draft.repeat(N, 1) if with_draft_probs else None
    torch.manual_seed(seed + 2)
    return sampler(meta, draft_probs, logits, random_md([1.0] * N)).sampled_token_ids


def chi2_pvalues(out: torch.Tensor, seed: int = 0) -> list[float]:
    """p-values of: position 0 ~ p0; position 1 (where emitted) ~ p1; the bonus ~ p2."""
    probs = torch.softmax(distributions(seed)[0].double(), -1).numpy()
    pvalues = []
    for pos in range(K + 1):
        col = out[:, pos].numpy()
        col = col[col != P]
        counts = np.bincount(col, minlength=V)
        expected = probs[pos] / probs[pos].sum() * len(col)
        pvalues.append(chisquare(counts, expected).pvalue)
    return pvalues


@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["draft_probs", "ngram"])
def test_random_output_matches_target_distribution(sampler, with_draft_probs):
    out = run_many(sampler, with_draft_probs)
    emitted = (out[:, 1] != P).sum().item()
    assert 0.05 * N < emitted < 0.95 * N  # both outcomes occur: the test is not vacuous
    assert min(chi2_pvalues(out)) > 1e-3


def test_chi_square_catches_always_accepting(sampler, monkeypatch):
    # u = 0 accepts every draft: the output is then the draft distribution.
    monkeypatch.setattr(
        rs, "generate_uniform_probs", lambda n, *a: torch.zeros(n, dtype=torch.float64)
    )
    out = run_many(sampler, with_draft_probs=True)
    assert (out != P).all()
    assert min(chi2_pvalues(out)) < 1e-6


def test_chi_square_catches_resampling_from_the_target(sampler, monkeypatch):
    # Resampling from p instead of the residual max(p - q, 0) over-weights the drafts.
    def from_target(rows, reqs, draft_token_ids, draft_probs, target_probs, generators):
        return torch.multinomial(target_probs[rows], 1).squeeze(1)

    monkeypatch.setattr(rs, "sample_recovered_tokens", from_target)
    assert min(chi2_pvalues(run_many(sampler, with_draft_probs=True))) < 1e-6


def test_seeded_rows_are_reproducible(sampler):
    target, draft = distributions(3)
    spec = [[0, 1]] * 8
    meta = SpecDecodeMetadata.make_dummy(spec, CPU)
    logits = target.repeat(8, 1)
    draft_probs = draft.repeat(8, 1)
    seeded = [0, 2, 5]

    def run(seed: int) -> torch.Tensor:
        gens = {row: torch.Generator().manual_seed(seed + row) for row in seeded}
        md = random_md([1.0] * 8, generators=gens)
        return sampler(meta, draft_probs, logits.clone(), md).sampled_token_ids[seeded]

    runs = [run(7) for _ in range(3)]
    torch.manual_seed(123)  # unseeded rows' randomness does not reach the seeded ones
    runs.append(run(7))
    assert all(torch.equal(runs[0], r) for r in runs[1:])
    others = {tuple(run(s).flatten().tolist()) for s in range(100, 110)}
    assert len(others) > 1  # the seed matters


def test_top_k_limits_recovered_tokens(sampler):
    # Target restricted to its top-1 token: every emitted token is that token.
    target, draft = distributions(4)
    n = 200
    spec = torch.stack([torch.multinomial(draft[k], n, True) for k in range(K)], 1).tolist()
    meta = SpecDecodeMetadata.make_dummy(spec, CPU)
    md = random_md([1.0] * n, top_k=torch.ones(n, dtype=torch.int32))
    out = sampler(meta, draft.repeat(n, 1), target.repeat(n, 1), md).sampled_token_ids
    best = target.argmax(-1)
    for pos in range(K + 1):
        col = out[:, pos]
        assert (col[col != P] == best[pos]).all()


def test_synthetic_mode_is_refused_by_name():
    class SyntheticConfig:
        rejection_sample_method = "synthetic"

    with pytest.raises(NotImplementedError, match="synthetic"):
        RejectionSampler(Sampler(), SyntheticConfig())
