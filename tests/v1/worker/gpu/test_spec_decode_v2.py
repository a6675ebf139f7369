"""EAGLE / EAGLE-3 speculative decoding on Model Runner V2, end to end (tiny
random float32 targets and heads, CPU, engine core in-process so the
scheduler's SpecDecodingStats can be counted).

- greedy outputs and their logprobs equal V2 without speculation, for random
  heads (most drafts rejected) with a prompt prefilled in two chunks, with
  async scheduling off and on;
- an oracle head (eagle_utils.make_oracle_eagle) has every draft accepted,
  async off and on, so steps emit several tokens and the next step's inputs
  come from the device rows;
- seeded random sampling is reproducible and does not depend on batch-mates;
- routing: eagle runs on V2 by default, on V1 with VLLM_USE_V2_MODEL_RUNNER=0;
  forcing V2 with ngram is upstream's error.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.utils import make_tiny_model
from tests.v1.spec_decode.eagle_utils import (
    make_bigram_target,
    make_oracle_eagle,
    make_tiny_eagle,
    make_tiny_eagle3,
)
from vllm import LLM, SamplingParams
from vllm.v1.spec_decode.metrics import SpecDecodingStats

K = 3
PROMPTS = [
    [5, 17, 3, 99, 42, 7, 250, 11] * 3,
    [8, 9, 10, 11, 12],
    list(range(100, 137)),  # 37 tokens: two prefill chunks of at most 32
]
GREEDY = SamplingParams(
    max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=2, prompt_logprobs=1
)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    target = make_tiny_model("llama", str(tmp_path_factory.mktemp("llama")))
    bigram = make_bigram_target(str(tmp_path_factory.mktemp("bigram")))
    return {
        "target": target,
        "eagle": make_tiny_eagle(target, str(tmp_path_factory.mktemp("e1"))),
        "eagle3": make_tiny_eagle3(
            target,
            str(tmp_path_factory.mktemp("e3")),
            draft_vocab_size=256,
            aux_layer_ids=[0, 1, 2],
        ),
        "bigram": bigram,
        "oracle": make_oracle_eagle(bigram, str(tmp_path_factory.mktemp("oracle"))),
    }


@contextmanager
def _llm(model: str, spec: dict[str, Any] | None = None, **kwargs: Any) -> Iterator[LLM]:
    """An in-process engine on Model Runner V2 (the default for a dense Llama)."""
    saved = {k: os.environ.get(k) for k in ("VLLM_ENABLE_V1_MULTIPROCESSING",)}
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    llm = None
    try:
        args: dict[str, Any] = dict(
            model=model,
            dtype="float32",
            enforce_eager=True,
            max_model_len=256,
            max_num_batched_tokens=32,
            max_num_seqs=4,
            block_size=16,
            disable_log_stats=False,  # the scheduler's SpecDecodingStats
            speculative_config=spec,
        )
        llm = LLM(**{**args, **kwargs})
        assert llm.llm_engine.vllm_config.use_v2_model_runner
        yield llm
    finally:
        if llm is not None:
            llm.llm_engine.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _generate(llm: LLM, params: SamplingParams | list[SamplingParams], prompts=PROMPTS):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0] for o in outs]


def _as_dicts(rows) -> list[dict[int, float]]:
    return [{t: lp.logprob for t, lp in (pos or {}).items()} for pos in rows]


def _tokens_and_logprobs(llm: LLM) -> tuple[list[list[int]], list[list[dict[int, float]]]]:
    """GREEDY over PROMPTS: (tokens, per request its sampled logprobs rows
    followed by its prompt logprobs rows)."""
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    rows = [_as_dicts(o.outputs[0].logprobs) + _as_dicts(o.prompt_logprobs or []) for o in outs]
    return tokens, rows


@pytest.fixture
def counts(monkeypatch) -> list[int]:
    """[drafted, accepted] over every verified step (the scheduler's stats)."""
    seen = [0, 0]
    real = SpecDecodingStats.observe_draft

    def spy(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        seen[0] += num_draft_tokens
        seen[1] += num_accepted_tokens
        real(self, num_draft_tokens, num_accepted_tokens)

    monkeypatch.setattr(SpecDecodingStats, "observe_draft", spy)
    return seen


@pytest.fixture(scope="module")
def baseline(models):
    with _llm(models["target"]) as llm:
        target = _tokens_and_logprobs(llm)
    with _llm(models["bigram"]) as llm:
        bigram = _tokens_and_logprobs(llm)
    return {"target": target, "bigram": bigram}


def _assert_same(got, want) -> None:
    assert got[0] == want[0]
    for got_req, want_req in zip(got[1], want[1]):
        # One logprobs row per emitted token, then the prompt's (chunked prefill).
        assert len(got_req) == len(want_req)
        for g, w in zip(got_req, want_req):
            assert g.keys() == w.keys()
            assert all(math.isclose(g[t], w[t], abs_tol=1e-4) for t in g)


@pytest.mark.parametrize(
    ("method", "async_scheduling"),
    [("eagle", False), ("eagle3", True), ("eagle3", False), ("eagle", True)],
)
def test_random_head_greedy_identical(models, baseline, counts, method, async_scheduling):
    spec = {"method": method, "model": models[method], "num_speculative_tokens": K}
    with _llm(models["target"], spec, async_scheduling=async_scheduling) as llm:
        assert llm.llm_engine.vllm_config.scheduler_config.async_scheduling is async_scheduling
        got = _tokens_and_logprobs(llm)
    _assert_same(got, baseline["target"])
    # A random head is rarely right: drafts were verified, most rejected.
    assert counts[0] >= len(PROMPTS) * K and counts[1] < counts[0], counts


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_oracle_head_all_accepted(models, baseline, counts, async_scheduling):
    spec = {"method": "eagle", "model": models["oracle"], "num_speculative_tokens": K}
    with _llm(models["bigram"], spec, async_scheduling=async_scheduling) as llm:
        got = _tokens_and_logprobs(llm)
    _assert_same(got, baseline["bigram"])
    assert counts[0] > 0 and counts[1] == counts[0], counts
    # 10 tokens at up to K + 1 per step: most steps emitted several tokens.
    assert counts[1] >= len(PROMPTS) * 4, counts


def test_seeded_random_reproducible_and_independent_of_batch_mates(models, counts):
    spec = {"method": "eagle", "model": models["oracle"], "num_speculative_tokens": K}

    def params(seed: int) -> SamplingParams:
        return SamplingParams(max_tokens=12, temperature=0.8, top_k=50, seed=seed, ignore_eos=True)

    with _llm(models["bigram"], spec) as llm:
        alone = _generate(llm, params(7), PROMPTS[:1])[0].token_ids
        mates = _generate(llm, [params(7), params(8), params(9)], PROMPTS)
        again = _generate(llm, params(7), PROMPTS[:1])[0].token_ids
    assert list(alone) == list(mates[0].token_ids) == list(again)
    assert list(mates[1].token_ids) != list(mates[2].token_ids)
    assert counts[1] > 0 and counts[1] < counts[0], counts  # random: some rejected


def test_routing(models, monkeypatch):
    from vllm.engine.arg_utils import EngineArgs

    def config(spec: dict[str, Any]):
        return EngineArgs(model=models["target"], device="cpu", speculative_config=spec)

    eagle = {"method": "eagle", "model": models["eagle"], "num_speculative_tokens": K}
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    assert config(eagle).create_engine_config().use_v2_model_runner
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    assert not config(eagle).create_engine_config().use_v2_model_runner
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    assert config(eagle).create_engine_config().use_v2_model_runner
    ngram = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3}
    with pytest.raises(ValueError, match="Model Runner V2 does not yet support: ngram"):
        config(ngram).create_engine_config()


def test_structured_outputs_with_async_drafts(models, monkeypatch, caplog):
    """test_eagle_acceptance's JSON-schema check on V2 with async scheduling:
    the scheduler marks drafts past the grammar's valid prefix -1 (it fetched
    the runner's drafts for the bitmask); V2 verifies its own device copies,
    which the masked logits reject; every output parses."""
    from tests.v1.spec_decode import test_eagle_acceptance
    from vllm.v1.core.sched.scheduler import Scheduler

    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    monkeypatch.setitem(test_eagle_acceptance.ENGINE, "async_scheduling", True)
    invalid: list[int] = []
    real = Scheduler.update_draft_token_ids_in_output

    def spy(self, draft_token_ids, scheduler_output):
        real(self, draft_token_ids, scheduler_output)
        invalid.extend((scheduler_output.num_invalid_spec_tokens or {}).values())

    monkeypatch.setattr(Scheduler, "update_draft_token_ids_in_output", spy)
    with caplog.at_level("ERROR"):
        test_eagle_acceptance.test_structured_outputs_stay_valid_with_eagle_drafts(
            (models["bigram"], models["oracle"]), monkeypatch
        )
    assert sum(invalid) > 0, "the grammar ruled out no draft"
    assert not [r for r in caplog.records if "rejected token" in r.getMessage()]


def test_token_dependent_params_see_the_drafts(models, counts):
    """Penalties and logit bias with drafts, some accepted: outputs equal no
    speculation (that draft row j counts drafts 1..j-1 as outputs is pinned
    by test_spec_rejection_sampler.py's penalty case)."""
    params = SamplingParams(
        max_tokens=40,
        temperature=0.0,
        ignore_eos=True,
        repetition_penalty=1.5,
        frequency_penalty=2.0,
        presence_penalty=0.5,
        logit_bias={7: 0.3, 11: -0.3},
    )
    plain = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    with _llm(models["bigram"]) as llm:
        want = [list(o.token_ids) for o in _generate(llm, params)]
        unpenalised = [list(o.token_ids) for o in _generate(llm, plain)]
    assert want != unpenalised  # the parameters matter here
    spec = {"method": "eagle", "model": models["oracle"], "num_speculative_tokens": K}
    with _llm(models["bigram"], spec) as llm:
        got = [list(o.token_ids) for o in _generate(llm, params)]
    assert got == want
    assert counts[1] > 0, counts  # some drafts were accepted under the penalties


def test_preemption_with_async_drafts(models, baseline, counts, monkeypatch):
    """A KV cache too small for the batch (requests preempted with a step in
    flight come back as new requests, prompt + outputs to prefill): outputs
    still equal no speculation, drafts still all accepted."""
    from vllm.v1.core.sched.scheduler import Scheduler

    preempted: list[str] = []
    real = Scheduler._preempt_request

    def spy(self, request, timestamp):
        preempted.append(request.request_id)
        real(self, request, timestamp)

    monkeypatch.setattr(Scheduler, "_preempt_request", spy)
    spec = {"method": "eagle", "model": models["oracle"], "num_speculative_tokens": K}
    with _llm(
        models["bigram"], spec, async_scheduling=True, max_model_len=96, num_gpu_blocks_override=8
    ) as llm:
        got = [list(o.token_ids) for o in _generate(llm, GREEDY)]
    assert got == baseline["bigram"][0]
    assert preempted, "no request was preempted"
    assert counts[0] > 0 and counts[1] == counts[0], counts
