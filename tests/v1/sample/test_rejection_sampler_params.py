"""RejectionSampler against the ordinary Sampler, parameter by parameter, on
the real persistent batch and its real logits processors.

The reference for request r with outputs o and drafts d_0..d_{n-1}: row j
(draft row j, or the bonus row j = n) is what the non-speculative Sampler
does on that row for a request whose outputs are o + d_0..d_{j-1}.
- greedy: the emitted tokens are the accepted prefix of the reference argmax
  chain, then the reference argmax at the first mismatch (or the bonus);
- random: at each position j, the tokens emitted there (rows whose drafts
  before j were all accepted) are distributed as the Sampler's draws on row
  j (two-sample chi-square), and a sampler that ignored the parameter would
  be told apart.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from scipy.stats import chi2_contingency

from tests.utils import TINY_VOCAB
from vllm.config import ModelConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.sample.logits_processor import (
    STR_SPEC_DEC_REJECTS_LOGITSPROCS,
    LogitsProcessors,
    build_logitsprocs,
)
from vllm.v1.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID, RejectionSampler
from vllm.v1.sample.sampler import Sampler
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

V = TINY_VOCAB
EOS = 0
CPU = torch.device("cpu")
P = PLACEHOLDER_TOKEN_ID


@pytest.fixture(scope="module")
def vllm_config(tiny_model_dir):
    return VllmConfig(model_config=ModelConfig(model=tiny_model_dir("llama"), dtype="float32"))


def make_params(**kw) -> SamplingParams:
    bad_words = kw.pop("bad_words_ids", None)
    params = SamplingParams(**kw)
    params.update_from_generation_config({}, EOS)
    if bad_words:
        params._bad_words_token_ids = bad_words
    return params


def make_batch(vllm_config, reqs: list[tuple[list[int], list[int], SamplingParams]], seed=None):
    """A refreshed InputBatch holding (prompt, outputs, params) per row."""
    batch = InputBatch(
        max_num_reqs=len(reqs), max_model_len=256, max_num_batched_tokens=256, device=CPU,
        pin_memory=False, vocab_size=V, block_sizes=[16],
        logitsprocs=build_logitsprocs(vllm_config, CPU, False),
    )  # fmt: skip
    states = []
    for i, (prompt, outputs, params) in enumerate(reqs):
        gen = None if seed is None else torch.Generator().manual_seed(seed + i)
        state = CachedRequestState(
            req_id=f"r{i}", prompt_token_ids=list(prompt), mm_features=[],
            sampling_params=params, generator=gen, block_ids=([],),
            num_computed_tokens=0, output_token_ids=list(outputs),
        )  # fmt: skip
        states.append(state)
        batch.add_request(state)
    batch.condense()
    batch.refresh_metadata()
    return batch, states


def reference_rows(vllm_config, reqs, drafts, rows: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """The Sampler's processed greedy logits per request and position j
    (history o + d[:j]): ref[r][j] [V]. rows[r] is request r's [n+1, V]."""
    ref: list[list[torch.Tensor]] = [[] for _ in reqs]
    for j in range(max(len(d) for d in drafts) + 1):
        live = [r for r in range(len(reqs)) if j <= len(drafts[r])]
        sub = [(reqs[r][0], reqs[r][1] + drafts[r][:j], reqs[r][2]) for r in live]
        batch, _ = make_batch(vllm_config, sub)
        logits = torch.stack([rows[r][j] for r in live])
        out = Sampler().apply_logits_processors(logits.clone(), batch.sampling_metadata)
        for k, r in enumerate(live):
            ref[r].append(out[k])
    return ref


def spec_logits(rows: list[torch.Tensor]) -> torch.Tensor:
    """make_dummy's layout: per request its draft rows then its bonus row."""
    return torch.cat(rows)


# (prompt, outputs, params) — each parameter alone, then combined.
GREEDY_CASES: dict[str, dict[str, Any]] = {
    "plain": dict(),
    "logit_bias": dict(logit_bias={7: 9.0, 8: 4.5}),
    "min_tokens": dict(min_tokens=4, stop_token_ids=[9]),  # outputs 2: positions 0, 1 masked
    "min_tokens_bonus": dict(min_tokens=5),  # outputs 2 + 3 drafts: the bonus is free again
    "repetition": dict(repetition_penalty=1.8),
    "frequency_presence": dict(frequency_penalty=2.0, presence_penalty=1.0),
    "bad_words": dict(bad_words_ids=[[11, 12], [13]]),
    "allowed": dict(allowed_token_ids=[10, 11, 12, 14, 15, 16]),
    "mix": dict(logit_bias={12: 3.0}, min_tokens=3, repetition_penalty=1.5, presence_penalty=0.5),
}


def greedy_logits(seed: int, n: int) -> torch.Tensor:
    """[n + 1, V]: a few strong candidates (EOS, 7..16) whose order varies by
    row, so every edit above changes some argmax."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n + 1, V, generator=g) - 20.0
    cand = [EOS, *range(7, 17)]
    logits[:, cand] = torch.rand(n + 1, len(cand), generator=g) * 4.0
    logits[:, EOS] += 2.0  # EOS usually wins without min_tokens
    return logits


def chain_drafts(vllm_config, req, row_logits, n, reject_at, seed):
    """Drafts that follow the reference argmax chain up to `reject_at`, where
    a token the reference does not pick is proposed instead."""
    drafts: list[int] = []
    for j in range(n):
        ref = reference_rows(vllm_config, [req], [drafts], [row_logits])[0][j]
        best = int(ref.argmax())
        if j == reject_at:
            choices = [t for t in range(7, 17) if t != best]
            best = choices[seed % len(choices)]
        drafts.append(best)
    return drafts


def greedy_case(vllm_config, name: str, n: int, reject_at: int | None):
    """(request, logits rows, drafts) for one case: the first seed whose
    logits make the edit change the argmax chain (so the case can fail)."""
    req = ([3, 4, 5, 11], [6, 11], make_params(temperature=0.0, **GREEDY_CASES[name]))
    for seed in range(1000 * len(name), 1000 * len(name) + 200):
        rows = greedy_logits(seed, n)
        drafts = chain_drafts(vllm_config, req, rows, n, reject_at, seed)
        ref = reference_rows(vllm_config, [req], [drafts], [rows])[0]
        raw = [int(x.argmax()) for x in rows]
        if name == "plain" or raw != [int(x.argmax()) for x in ref]:
            return req, rows, drafts
    raise AssertionError(f"no logits where {name} matters")


@pytest.mark.parametrize("reject_at", [None, 1], ids=["all_accepted", "reject_at_1"])
def test_greedy_matches_the_sampler_per_position(vllm_config, reject_at):
    n = 3
    names = list(GREEDY_CASES)
    reqs, rows, drafts = [], [], []
    for name in names:
        req, row_logits, d = greedy_case(vllm_config, name, n, reject_at)
        reqs.append(req)
        rows.append(row_logits)
        drafts.append(d)
    # One request without drafts rides along.
    reqs.append(([3], [4], make_params(temperature=0.0, logit_bias={9: 30.0})))
    rows.append(greedy_logits(99, 0))
    drafts.append([])

    ref = reference_rows(vllm_config, reqs, drafts, rows)
    expected = []
    for r, d in enumerate(drafts):
        chain = [int(x.argmax()) for x in ref[r]]
        k = next((j for j in range(len(d)) if d[j] != chain[j]), len(d))
        expected.append(d[:k] + [chain[k]])
    assert expected[-1] == [9]
    if reject_at is None:
        assert all(len(e) == n + 1 for e in expected[:-1])

    batch, _ = make_batch(vllm_config, reqs)
    meta = SpecDecodeMetadata.make_dummy(drafts, CPU)
    out = RejectionSampler(Sampler())(meta, None, spec_logits(rows), batch.sampling_metadata)
    tokens, _ = RejectionSampler.parse_output(out.sampled_token_ids, V)
    for name, got, want in zip([*names, "no_drafts"], tokens, expected):
        assert got == want, name

    # min_tokens: stop masked exactly while len(outputs) + j < min_tokens.
    mt = names.index("min_tokens_bonus")
    if reject_at is None:
        assert tokens[mt][-1] == EOS  # the bonus (position 3: 2 + 3 >= 5) may stop
    assert EOS not in tokens[mt][:3]


def test_bonus_row_sees_drafts_in_penalties(vllm_config):
    # Drafts [7, 7]: at the bonus the history holds two 7s; a frequency
    # penalty of 2 per occurrence drops 7 below 8 only there.
    req = ([1], [2], make_params(temperature=0.0, frequency_penalty=2.0))
    logits = torch.full((3, V), -20.0)
    logits[:, 7] = 10.0
    logits[:, 8] = 7.5
    batch, _ = make_batch(vllm_config, [req])
    meta = SpecDecodeMetadata.make_dummy([[7, 7]], CPU)
    out = RejectionSampler(Sampler())(meta, None, logits, batch.sampling_metadata)
    # position 1 (one 7 in history): 10 - 2 > 7.5, accepted; bonus: 10 - 4 < 7.5.
    assert out.sampled_token_ids.tolist() == [[7, 7, 8]]


def test_min_tokens_at_draft_positions_direct(vllm_config):
    """MinTokensLogitsProcessor.apply_with_spec_decode (upstream's entry point):
    rows masked exactly while len(outputs) + j < min_tokens."""
    reqs = [
        ([1], [2], make_params(min_tokens=3, stop_token_ids=[5])),  # 1 output: j = 0, 1 masked
        ([1], [], make_params()),
        ([1], [2, 3, 4], make_params(min_tokens=4)),  # j = 0 masked
    ]
    batch, _ = make_batch(vllm_config, reqs)
    (proc,) = [
        p for p in batch.sampling_metadata.logitsprocs.non_argmax_invariant
        if type(p).__name__ == "MinTokensLogitsProcessor"
    ]  # fmt: skip
    logits = torch.zeros(3 + 2 + 3, V)
    out = proc.apply_with_spec_decode(logits, [3, 2, 3])
    masked = torch.isinf(out[:, [EOS, 5]]).tolist()
    assert masked == [[True, True], [True, True], [False, False]] + [[False, False]] * 2 + [
        [True, False], [False, False], [False, False]
    ]  # fmt: skip


def test_unknown_logits_processor_is_refused(vllm_config):
    class Custom:
        def is_argmax_invariant(self) -> bool:
            return False

    batch, _ = make_batch(vllm_config, [([1], [2], make_params(temperature=0.0))])
    md = batch.sampling_metadata
    md.logitsprocs = LogitsProcessors([Custom()])  # type: ignore[list-item]
    meta = SpecDecodeMetadata.make_dummy([[3]], CPU)
    with pytest.raises(ValueError, match=STR_SPEC_DEC_REJECTS_LOGITSPROCS):
        RejectionSampler(Sampler())(meta, None, torch.zeros(2, V), md)


@pytest.mark.parametrize("mode", ["processed_logprobs", "processed_logits"])
def test_processed_logprobs_of_emitted_tokens(vllm_config, mode):
    """Each emitted token's processed logprob (and the top 2) is what the
    Sampler in that mode reports on its row, with the history it follows."""
    torch.manual_seed(0)
    reqs = [
        ([3, 7], [6, 8], make_params(temperature=0.0, logit_bias={9: 1.0}, presence_penalty=1.0)),
        ([3, 7], [6], make_params(temperature=0.7, top_k=3, min_tokens=3)),
        ([3, 7], [6, 8], make_params(temperature=1.3, top_p=0.8, repetition_penalty=1.4)),
    ]
    drafts = [DRAFTS, DRAFTS[:2], []]
    rows = [random_logits(10 + r)[: len(d) + 1] for r, d in enumerate(drafts)]
    batch, _ = make_batch(vllm_config, reqs)
    md = batch.sampling_metadata
    md.max_num_logprobs = 2
    sampler = RejectionSampler(Sampler(mode))
    meta = SpecDecodeMetadata.make_dummy(drafts, CPU)
    out = sampler(meta, None, spec_logits(rows), md)
    tokens, lp = RejectionSampler.parse_output(
        out.sampled_token_ids, V, logprobs_tensors=out.logprobs_tensors
    )
    assert lp is not None and lp.cu_num_generated_tokens is not None
    for r, toks in enumerate(tokens):
        assert toks, r
        for j, tok in enumerate(toks):
            one, _ = make_batch(vllm_config, [(reqs[r][0], reqs[r][1] + drafts[r][:j], reqs[r][2])])
            ref_sampler = Sampler(mode)
            edited = ref_sampler.apply_logits_processors(
                rows[r][j : j + 1].clone(), one.sampling_metadata
            )
            _, processed = ref_sampler.sample(edited, one.sampling_metadata)
            assert processed is not None
            i = lp.cu_num_generated_tokens[r] + j
            assert lp.logprob_token_ids[i][0] == tok
            torch.testing.assert_close(
                lp.logprobs[i][0], processed[0, tok].item(), atol=1e-5, rtol=0
            )
            top = processed[0].topk(2)
            torch.testing.assert_close(
                torch.tensor(lp.logprobs[i][1:]), top.values, atol=1e-5, rtol=0
            )


# ---- random sampling: per position, the Sampler's distribution -----------------

N = 2000  # identical requests per run
DRAFTS = [7, 8, 9]
RANDOM_CASES: dict[str, dict[str, Any]] = {
    "temperature": dict(temperature=0.7),
    "top_k": dict(temperature=1.0, top_k=3),
    "top_p": dict(temperature=1.0, top_p=0.6),
    "min_p": dict(temperature=1.0, min_p=0.3),
    "logit_bias": dict(temperature=1.0, logit_bias={10: 1.5, 11: -2.0, 12: 1.0}),
    "min_tokens": dict(temperature=1.0, min_tokens=4),  # outputs 2: EOS banned at 0, 1
    "penalties": dict(temperature=1.0, frequency_penalty=0.4, repetition_penalty=1.3),
    "bad_words": dict(temperature=1.0, bad_words_ids=[[7, 8, 10], [11]]),
}


def random_logits(seed: int) -> torch.Tensor:
    """[4, V]: mass spread over EOS and 7..12, row j's draft DRAFTS[j]
    likely enough to be accepted often, the rest of the vocabulary far below."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.full((4, V), -30.0)
    cand = [EOS, 7, 8, 9, 10, 11, 12]
    logits[:, cand] = torch.randn(4, len(cand), generator=g) * 0.5
    logits[torch.arange(3), torch.tensor(DRAFTS)] += 2.0
    return logits


def counts_by_position(out: torch.Tensor) -> list[np.ndarray]:
    res = []
    for j in range(out.shape[1]):
        col = out[:, j].numpy()
        res.append(np.bincount(col[col != P], minlength=V))
    return res


def contingency_p(a: np.ndarray, b: np.ndarray) -> float:
    keep = (a + b) > 0
    table = np.stack([a[keep], b[keep]])
    if table.shape[1] < 2:
        return 1.0
    return float(chi2_contingency(table).pvalue)


def sampler_draws(vllm_config, params, outputs, logits_row, j) -> np.ndarray:
    """N draws of the ordinary Sampler at position j (history outputs + d[:j])."""
    reqs = [([3, 7], outputs + DRAFTS[:j], params)] * N
    batch, _ = make_batch(vllm_config, reqs)
    out = Sampler()(logits_row.repeat(N, 1), batch.sampling_metadata).sampled_token_ids
    return np.bincount(out.flatten().numpy(), minlength=V)


@pytest.mark.parametrize("name", list(RANDOM_CASES))
def test_random_matches_the_sampler_per_position(vllm_config, name):
    torch.manual_seed(1234)
    params = make_params(**RANDOM_CASES[name])
    outputs = [6, 8]
    logits = random_logits(5)
    reqs = [([3, 7], outputs, params)] * N
    batch, _ = make_batch(vllm_config, reqs)
    meta = SpecDecodeMetadata.make_dummy([DRAFTS] * N, CPU)
    sampler = RejectionSampler(Sampler())
    out = sampler(meta, None, logits.repeat(N, 1), batch.sampling_metadata).sampled_token_ids
    got = counts_by_position(out)

    plain, _ = make_batch(vllm_config, [([3, 7], outputs, make_params(temperature=1.0))] * N)
    ignoring = counts_by_position(
        sampler(meta, None, logits.repeat(N, 1), plain.sampling_metadata).sampled_token_ids
    )
    told_apart = False
    for j in range(3):  # positions 0..2 (2 drafts deep)
        assert got[j].sum() > 200, (name, j)  # position j is reached often
        want = sampler_draws(vllm_config, params, outputs, logits[j], j)
        # 1e-4 per comparison: 24 of them (8 cases x 3 positions) in this file.
        assert contingency_p(got[j], want) > 1e-4, (name, j)
        told_apart |= contingency_p(ignoring[j], want) < 1e-6
    assert told_apart, name  # a sampler ignoring the parameter would fail


def test_seeded_rows_do_not_depend_on_batch_mates(vllm_config):
    params = make_params(temperature=1.0, seed=0, logit_bias={10: 1.0})
    logits = random_logits(6)

    def run(extra_rows: int, mate_drafts: list[int]) -> list[int]:
        reqs = [([3, 7], [6, 8], params)] + [([2], [5], make_params(temperature=0.9))] * extra_rows
        batch, _ = make_batch(vllm_config, reqs, seed=77)
        drafts = [DRAFTS] + [mate_drafts] * extra_rows
        meta = SpecDecodeMetadata.make_dummy(drafts, CPU)
        rows = [logits] + [random_logits(7 + i)[: len(mate_drafts) + 1] for i in range(extra_rows)]
        out = RejectionSampler(Sampler())(meta, None, torch.cat(rows), batch.sampling_metadata)
        return out.sampled_token_ids[0].tolist()

    alone = [run(0, []) for _ in range(2)]
    assert alone[0] == alone[1]
    assert run(5, [9, 9]) == alone[0]
    assert run(3, []) == alone[0]
