"""Sampling under n-gram speculative decoding, end to end (LLM on a tiny
random Llama, V1 runner):
- random sampling: over many seeded requests, the tokens at each of the first
  positions (with the token before) are distributed as without speculation
  (the default engine, Model Runner V2; two-sample chi-square),
  plain and with every sampling parameter at once, while drafts are being
  accepted AND rejected; an always-accepting verifier is told apart;
- a seeded request's output is reproducible and does not depend on its
  batch-mates (the same with speculation; not the same as without it: the
  random stream is consumed differently);
- structured outputs (JSON schema) stay valid and finished, with drafts from
  a prompt that repeats JSON proposed and accepted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from scipy.stats import chi2_contingency

import vllm.v1.sample.rejection_sampler as rs
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from vllm.sampling_params import StructuredOutputsParams
from vllm.v1.core.sched.scheduler import Scheduler

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
# A token budget large enough that no step cuts a request's drafts: how many
# drafts are verified then depends on the request alone (see the batch-mates
# test).
ENGINE: dict[str, Any] = dict(
    dtype="float32",
    enforce_eager=True,
    max_model_len=256,
    max_num_batched_tokens=4096,
    max_num_seqs=200,
    block_size=16,
    seed=0,
    disable_log_stats=False,
)
EOS = 0
PHRASE = [11, 22, 33, 44]
PROMPT = PHRASE * 2  # prompt lookup always finds the last token earlier on
NUM_REQUESTS = 200
POSITIONS = 4


class _Drafts:
    """Draft / accepted token totals per request id (the scheduler's view)."""

    def __init__(self) -> None:
        self.drafted: dict[str, int] = {}
        self.accepted: dict[str, int] = {}

    def total(self) -> tuple[int, int]:
        return sum(self.drafted.values()), sum(self.accepted.values())


@pytest.fixture(scope="module")
def drafts() -> Iterator[_Drafts]:
    recorded = _Drafts()
    real = Scheduler.update_from_output

    def spy(self, scheduler_output, model_runner_output):
        sampled = model_runner_output.sampled_token_ids
        for req_id, spec in scheduler_output.scheduled_spec_decode_tokens.items():
            row = model_runner_output.req_id_to_index[req_id]
            recorded.drafted[req_id] = recorded.drafted.get(req_id, 0) + len(spec)
            num_accepted = max(len(sampled[row]) - 1, 0) if sampled else 0
            recorded.accepted[req_id] = recorded.accepted.get(req_id, 0) + num_accepted
        return real(self, scheduler_output, model_runner_output)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Scheduler, "update_from_output", spy)
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the spy runs in this process
        yield recorded


@pytest.fixture(scope="module")
def base_llm(tiny_model_dir, drafts) -> LLM:
    return LLM(model=tiny_model_dir("llama"), **ENGINE)


@pytest.fixture(scope="module")
def spec_llm(tiny_model_dir, drafts) -> LLM:
    return LLM(model=tiny_model_dir("llama"), speculative_config=NGRAM, **ENGINE)


def _run(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]):
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params)
    return [o.outputs[0] for o in outs]


def _tokens(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> list[list[int]]:
    return [list(o.token_ids) for o in _run(llm, prompts, params)]


# ---- distribution of the first positions ----------------------------------------

CASES: dict[str, dict[str, Any]] = {
    "plain": dict(temperature=1.0, allowed_token_ids=PHRASE, ignore_eos=True),
    "all_params": dict(
        temperature=0.8,
        top_k=4,
        top_p=0.95,
        min_p=0.05,
        presence_penalty=0.5,
        frequency_penalty=0.3,
        repetition_penalty=1.3,
        logit_bias={PHRASE[0]: 1.5, PHRASE[2]: -0.5},
        min_tokens=3,  # EOS (allowed) is banned at positions 0..2 only
        allowed_token_ids=[EOS, *PHRASE],
    ),
}


def _counts(outputs: list[list[int]]) -> list[dict[tuple[int, ...], int]]:
    """Per position k: counts of the pair (token k-1, token k) (of token 0
    for k = 0). Pairs, not marginals: a verifier that accepted too often
    would make token k follow token k-1 as the drafts do, which the
    marginals can hide."""
    counts: list[dict[tuple[int, ...], int]] = [{} for _ in range(POSITIONS)]
    for toks in outputs:
        for pos in range(min(len(toks), POSITIONS)):
            key = tuple(toks[max(pos - 1, 0) : pos + 1])
            counts[pos][key] = counts[pos].get(key, 0) + 1
    return counts


def _pvalue(a: dict[tuple[int, ...], int], b: dict[tuple[int, ...], int]) -> float:
    keys = sorted(set(a) | set(b))
    table = np.array([[a.get(k, 0) for k in keys], [b.get(k, 0) for k in keys]])
    return 1.0 if len(keys) < 2 else float(chi2_contingency(table).pvalue)


_BASE: dict[str, list[dict[tuple[int, ...], int]]] = {}


def _base_counts(base_llm: LLM, case: str) -> list[dict[tuple[int, ...], int]]:
    if case not in _BASE:
        _BASE[case] = _counts(_draws(base_llm, case, 0))
    return _BASE[case]


def _draws(llm: LLM, case: str, seed0: int) -> list[list[int]]:
    params = [
        SamplingParams(max_tokens=POSITIONS, seed=seed0 + i, **CASES[case])
        for i in range(NUM_REQUESTS)
    ]
    return _tokens(llm, [PROMPT] * NUM_REQUESTS, params)


@pytest.mark.parametrize("case", list(CASES))
def test_first_positions_distributed_as_without_speculation(base_llm, spec_llm, drafts, case):
    base = _base_counts(base_llm, case)
    drafts.drafted.clear()
    drafts.accepted.clear()
    spec_out = _draws(spec_llm, case, 10**6)  # other seeds: independent samples
    drafted, accepted = drafts.total()
    # Drafts are verified at positions 1..3, some accepted and some rejected.
    assert 0.1 * drafted < accepted < 0.9 * drafted, (drafted, accepted)
    spec = _counts(spec_out)
    for pos in range(POSITIONS):
        if case == "all_params" and pos < 3:
            assert all(key[-1] != EOS for key in spec[pos]), pos  # min_tokens at drafts
        # 1e-4 per comparison: 8 of them in this file.
        pvalue = _pvalue(base[pos], spec[pos])
        print(case, pos, "p =", pvalue)
        assert pvalue > 1e-4, (case, pos, base[pos], spec[pos])
    if case == "all_params":
        assert any(key[-1] == EOS for key in spec[3])  # position 3 may stop


def test_always_accepting_verifier_is_told_apart(base_llm, spec_llm, monkeypatch):
    # u = 0 accepts every draft: the drafts' continuation of the phrase is
    # then over-represented, which the comparison above must catch.
    base = _base_counts(base_llm, "plain")
    monkeypatch.setattr(
        rs, "generate_uniform_probs", lambda n, *a: rs.torch.zeros(n, dtype=rs.torch.float64)
    )
    spec = _counts(_draws(spec_llm, "plain", 10**6))
    pvalues = [_pvalue(base[pos], spec[pos]) for pos in range(1, POSITIONS)]
    print("always-accepting p-values", pvalues)
    assert min(pvalues) < 1e-6


# ---- seeded requests ---------------------------------------------------------------


def test_seeded_request_reproducible_and_independent_of_batch_mates(spec_llm, drafts):
    prompt = PHRASE * 3 + PHRASE[:2]
    seeded = SamplingParams(temperature=1.0, seed=1234, max_tokens=12, ignore_eos=True)
    seeded.allowed_token_ids = [*PHRASE, 55, 66]
    drafts.drafted.clear()
    alone = _tokens(spec_llm, [prompt], [seeded])[0]
    assert sum(drafts.drafted.values()) > 0  # it was speculated on
    assert _tokens(spec_llm, [prompt], [seeded])[0] == alone
    mates = [[5, 6, 7, 5, 6, 7, 5, 6], [9] * 12, PHRASE * 2, [100, 200, 300]]
    mate_params = [
        SamplingParams(temperature=0.9, max_tokens=10, ignore_eos=True),
        SamplingParams(temperature=1.0, seed=7, max_tokens=14, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
        SamplingParams(temperature=1.2, top_k=5, max_tokens=12, ignore_eos=True),
    ]
    prompts, params = [prompt, *mates], [seeded, *mate_params]
    assert _tokens(spec_llm, prompts, params)[0] == alone
    assert _tokens(spec_llm, prompts[::-1], params[::-1])[-1] == alone
    assert _tokens(spec_llm, [mates[2], prompt], [mate_params[2], seeded])[-1] == alone


# ---- structured outputs ------------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["ok", "color", "n"],
    "additionalProperties": False,
}
EXAMPLES = '{"ok":true,"color":"green","n":7}\n{"ok":false,"color":"red","n":42}\n'


def test_structured_outputs_stay_valid_with_drafts(spec_llm, drafts):
    tokenizer = spec_llm.get_tokenizer()
    prompt = tokenizer.encode(EXAMPLES * 3, add_special_tokens=False)
    so = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    params = [
        SamplingParams(temperature=t, seed=s, max_tokens=80, structured_outputs=so)
        for t, s in [(0.0, None), (0.7, 1), (1.0, 2), (1.0, 3), (1.5, 4), (0.0, None)]
    ]
    drafts.drafted.clear()
    drafts.accepted.clear()
    outs = _run(spec_llm, [prompt] * len(params), params)
    drafted, accepted = drafts.total()
    assert accepted > 0, (drafted, accepted)  # JSON drafts proposed and accepted
    for out in outs:
        assert out.finish_reason == "stop", out.text
        obj = json.loads(out.text)
        assert set(obj) == {"ok", "color", "n"}, obj
        assert isinstance(obj["ok"], bool)
        assert obj["color"] in ("red", "green", "blue")
        assert type(obj["n"]) is int and 0 <= obj["n"] <= 99
