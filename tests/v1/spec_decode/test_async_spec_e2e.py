"""Speculative decoding under async scheduling on the V1 runner (issue 19:
"with async scheduling on and off").

The scheduler plans step N+1 before step N's output: it sends placeholder
drafts and counts step N's drafts as accepted; the runner puts its own drafts
in and corrects the positions by step N's rejections
(vllm/v1/worker/async_spec_decode.py). Greedy outputs must equal the same
engine without speculation and with sync speculation, for draft_model (a
different draft: some drafts rejected, so corrections happen and are
counted; and every draft the draft model's own greedy continuation), eagle
and eagle3 (random heads; and an oracle EAGLE head whose drafts are all
accepted only if the runner's drafts reach the step's inputs), with chunked
prefill, prefix-cache hits, a preemption and TP=2; seeded random sampling is
reproducible.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.v1.spec_decode import test_draft_model, test_eagle_acceptance, test_ngram_e2e
from tests.v1.spec_decode.eagle_utils import make_tiny_eagle, make_tiny_eagle3
from tests.v1.spec_decode.test_draft_model import (
    ENGINE,
    MORE_PROMPTS,
    PROMPTS,
    _count_acceptance,
    _generate,
    _llm,
    reference,  # noqa: F401  (fixtures)
    reference_more,  # noqa: F401
    target,  # noqa: F401
    truncated_draft,  # noqa: F401
)
from tests.v1.spec_decode.test_eagle_acceptance import models  # noqa: F401  (fixture)
from tests.v1.spec_decode.test_ngram_e2e import stats  # noqa: F401  (fixture)
from vllm import SamplingParams
from vllm.inputs import TokensPrompt
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.worker.async_spec_decode import AsyncSpecDrafts

ASYNC = {"async_scheduling": True}


def _count_corrections(monkeypatch) -> list[int]:
    """[steps where a request stayed in the batch, of which the runner had to
    correct the scheduler's optimistic count by rejected drafts]."""
    counts = [0, 0]
    real = AsyncSpecDrafts.corrected_num_computed

    def spy(self, req_id: str, num_computed: int) -> int:
        out = real(self, req_id, num_computed)
        counts[0] += 1
        counts[1] += out != num_computed
        return out

    monkeypatch.setattr(AsyncSpecDrafts, "corrected_num_computed", spy)
    return counts


def _assert_async(llm: Any) -> None:
    config = llm.llm_engine.vllm_config
    assert config.scheduler_config.async_scheduling is True
    assert not config.use_v2_model_runner


@pytest.fixture(scope="module")
def heads(target, tmp_path_factory) -> dict[str, str]:  # noqa: F811
    return {
        "eagle": make_tiny_eagle(target, str(tmp_path_factory.mktemp("eagle"))),
        "eagle3": make_tiny_eagle3(
            target,
            str(tmp_path_factory.mktemp("eagle3")),
            draft_vocab_size=256,
            aux_layer_ids=[0, 1],
        ),
    }


def test_draft_model_async_equals_sync_and_no_spec(
    target,  # noqa: F811
    truncated_draft,  # noqa: F811
    reference,  # noqa: F811
    monkeypatch,
):
    """Some drafts accepted, some rejected: the runner corrected the
    scheduler's optimistic positions, outputs equal no-spec and sync spec,
    also in a second round served from the prefix cache."""
    counts = _count_acceptance(monkeypatch)
    corrections = _count_corrections(monkeypatch)
    with _llm(target, {"model": truncated_draft}, **ENGINE, **ASYNC) as llm:
        _assert_async(llm)
        assert _generate(llm, PROMPTS)[0] == reference
        outputs, cached = _generate(llm, PROMPTS)
    assert outputs == reference
    assert cached[1] >= 16, cached
    assert 0 < counts[1] < counts[0], counts
    assert corrections[1] > 0, corrections
    sync_counts = list(counts)
    with _llm(target, {"model": truncated_draft}, **ENGINE, async_scheduling=False) as llm:
        assert _generate(llm, PROMPTS)[0] == reference
    assert counts[0] > sync_counts[0]


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_eagle_async_equals_no_spec(
    target,  # noqa: F811
    heads,
    reference,  # noqa: F811
    monkeypatch,
    method,
):
    counts = _count_acceptance(monkeypatch)
    corrections = _count_corrections(monkeypatch)
    spec = {"method": method, "model": heads[method]}
    with _llm(target, spec, **ENGINE, **ASYNC) as llm:
        _assert_async(llm)
        assert _generate(llm, PROMPTS)[0] == reference
    assert counts[0] > 0, counts  # drafts were verified
    assert corrections[0] > 0 and corrections[1] > 0, corrections


def test_draft_model_async_drafts_are_its_greedy(
    target,  # noqa: F811
    truncated_draft,  # noqa: F811
    reference,  # noqa: F811
    monkeypatch,
):
    """test_draft_model's check of every draft against transformers' greedy
    continuation of the row's known tokens, run with async scheduling on:
    the draft model's pass 1 sees the corrected positions."""
    monkeypatch.setitem(test_draft_model.ENGINE, "async_scheduling", True)
    test_draft_model.test_different_draft_is_lossless_and_drafts_its_greedy(
        target, truncated_draft, reference, monkeypatch
    )


def test_oracle_eagle_async_accepts_every_draft(models, monkeypatch):  # noqa: F811
    """The oracle head's drafts are always right: all accepted under async
    scheduling too (placeholder drafts would be rejected), prefix-cache hits
    included, outputs equal no speculation."""
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    with test_eagle_acceptance._llm(models[0]) as llm:
        reference_out = test_eagle_acceptance._generate(llm)[0]
    counts = _count_acceptance(monkeypatch)
    spec = {"method": "eagle", "model": models[1], "num_speculative_tokens": 3}
    with test_eagle_acceptance._llm(models[0], spec, **ASYNC) as llm:
        _assert_async(llm)
        for _ in range(2):  # the second round from the prefix cache
            assert test_eagle_acceptance._generate(llm)[0] == reference_out
    assert counts[0] > 0 and counts[1] == counts[0], counts


def test_logprobs_under_async_spec(
    target,  # noqa: F811
    truncated_draft,  # noqa: F811
    stats,  # noqa: F811
):
    """test_ngram_e2e's logprobs check (one row per emitted token, prompt
    logprobs through chunked prefill, values equal to no speculation) with an
    async draft_model engine."""
    with (
        _llm(target, **ENGINE) as base,
        _llm(target, {"model": truncated_draft}, **ENGINE, **ASYNC) as spec,
    ):
        _assert_async(spec)
        test_ngram_e2e.test_logprobs_for_every_emitted_token(base, spec, stats)


def test_preemption_under_async_spec(
    target,  # noqa: F811
    truncated_draft,  # noqa: F811
    reference_more,  # noqa: F811
    monkeypatch,
):
    """A KV cache too small for the batch: requests preempted with steps in
    flight are recomputed; outputs still equal the no-spec run."""
    counts = _count_acceptance(monkeypatch)
    preempted: list[str] = []
    real = Scheduler._preempt_request

    def spy(self, request, timestamp):
        preempted.append(request.request_id)
        real(self, request, timestamp)

    monkeypatch.setattr(Scheduler, "_preempt_request", spy)
    spec = {"model": truncated_draft}
    with _llm(target, spec, num_gpu_blocks_override=10, **ENGINE, **ASYNC) as llm:
        _assert_async(llm)
        assert _generate(llm, MORE_PROMPTS)[0] == reference_more
    assert preempted, "no request was preempted"
    assert 0 < counts[1] < counts[0], counts


def test_seeded_random_sampling_reproducible(target, truncated_draft):  # noqa: F811
    """Per-request seeds under async + spec: the same tokens run after run
    and whatever the batch-mates."""
    params = [
        SamplingParams(temperature=1.0, top_p=0.9, seed=s, max_tokens=16, ignore_eos=True)
        for s in range(len(PROMPTS))
    ]
    prompts = [TokensPrompt(prompt_token_ids=p) for p in PROMPTS]
    with _llm(target, {"model": truncated_draft}, **ENGINE, **ASYNC) as llm:
        runs = [
            [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
            for _ in range(2)
        ]
        alone = llm.generate(prompts[2:3], params[2:3], use_tqdm=False)
    assert runs[0] == runs[1]
    assert list(alone[0].outputs[0].token_ids) == runs[0][2]
    assert len({tuple(r) for r in runs[0]}) == len(PROMPTS)


def test_tp2_async_draft_model(
    target,  # noqa: F811
    truncated_draft,  # noqa: F811
    reference,  # noqa: F811
    monkeypatch,
):
    """Target and draft at TP=2 (multiprocess workers, each keeping its own
    drafts): identical outputs with async scheduling on."""
    counts = _count_acceptance(monkeypatch)
    spec = {"model": truncated_draft}
    with _llm(target, spec, tensor_parallel_size=2, **ENGINE, **ASYNC) as llm:
        _assert_async(llm)
        assert llm.llm_engine.vllm_config.parallel_config.distributed_executor_backend == "mp"
        assert _generate(llm, PROMPTS)[0] == reference
    assert 0 < counts[1] < counts[0], counts


def test_structured_outputs_with_async_eagle_drafts(models, monkeypatch, caplog):  # noqa: F811
    """test_eagle_acceptance's JSON-schema check with async scheduling on:
    the engine core fetches the runner's drafts for the grammar bitmask
    (Scheduler.update_draft_token_ids_in_output), drafts past the grammar's
    valid prefix become -1 there (skipped by the bitmask, no grammar error)
    and the runner's copies are masked out and rejected; every output parses."""
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    monkeypatch.setitem(test_eagle_acceptance.ENGINE, "async_scheduling", True)
    invalid: list[int] = []
    real = Scheduler.update_draft_token_ids_in_output

    def spy(self, draft_token_ids, scheduler_output):
        real(self, draft_token_ids, scheduler_output)
        invalid.extend((scheduler_output.num_invalid_spec_tokens or {}).values())

    monkeypatch.setattr(Scheduler, "update_draft_token_ids_in_output", spy)
    with caplog.at_level("ERROR"):
        test_eagle_acceptance.test_structured_outputs_stay_valid_with_eagle_drafts(
            models, monkeypatch
        )
    assert sum(invalid) > 0, "the grammar ruled out no draft"
    assert not [r for r in caplog.records if "rejected token" in r.getMessage()]
