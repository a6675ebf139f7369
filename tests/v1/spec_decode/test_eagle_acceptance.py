"""EAGLE drafts that are always right: a one-layer target whose next token
depends only on the current token, and an EAGLE-1 head that computes exactly
that (eagle_utils.make_oracle_eagle). Every draft must then be accepted, and
the outputs stay identical to no speculation: this drives the accepted-draft
path (several tokens per step, pass 1 over accepted tokens with their target
states) in one process and at TP=2, with prefix caching and chunked prefill.
`runner`: the V1 runner (VLLM_USE_V2_MODEL_RUNNER=0) or Model Runner V2 (the
default for this target); the single-process oracle case runs on both."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.v1.spec_decode.eagle_utils import make_bigram_target, make_oracle_eagle
from vllm import LLM, SamplingParams
from vllm.v1.spec_decode.metrics import SpecDecodingStats

K = 3
PROMPTS = [[5, 17, 3, 99, 42, 7, 250, 11] * 5, [8, 9, 10, 11, 12]]  # 40 tokens: 2 chunks
GREEDY = SamplingParams(max_tokens=13, temperature=0.0, ignore_eos=True)
ENGINE = dict(
    max_num_batched_tokens=32, block_size=16, enable_prefix_caching=True, disable_log_stats=False
)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[str, str]:
    target = make_bigram_target(str(tmp_path_factory.mktemp("bigram")))
    return target, make_oracle_eagle(target, str(tmp_path_factory.mktemp("oracle")))


@contextmanager
def _llm(
    model: str, spec: dict[str, Any] | None = None, runner: str | None = None, **kwargs: Any
) -> Iterator[LLM]:
    """An engine whose core runs in this process (the stats spy sees it), on
    the given model runner (None: as VLLM_USE_V2_MODEL_RUNNER says, default V2)."""
    old_runner = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    if runner is not None:
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = {"v1": "0", "v2": "1"}[runner]
    old = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    llm = None
    try:
        llm = LLM(
            model=model,
            dtype="float32",
            enforce_eager=True,
            max_model_len=128,
            speculative_config=spec,
            **ENGINE,
            **kwargs,
        )
        if runner is not None:
            assert llm.llm_engine.vllm_config.use_v2_model_runner is (runner == "v2")
        yield llm
    finally:
        if llm is not None:
            llm.llm_engine.shutdown()
        for name, value in (
            ("VLLM_ENABLE_V1_MULTIPROCESSING", old),
            ("VLLM_USE_V2_MODEL_RUNNER", old_runner),
        ):
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _generate(llm: LLM) -> tuple[list[list[int]], list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], [o.num_cached_tokens or 0 for o in outs]


def _count_acceptance(monkeypatch) -> list[int]:
    """[drafted, accepted] over every verified step (the scheduler's stats)."""
    counts = [0, 0]
    real = SpecDecodingStats.observe_draft

    def spy(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        counts[0] += num_draft_tokens
        counts[1] += num_accepted_tokens
        real(self, num_draft_tokens, num_accepted_tokens)

    monkeypatch.setattr(SpecDecodingStats, "observe_draft", spy)
    return counts


@pytest.fixture(scope="module")
def reference(models) -> list[list[int]]:
    with _llm(models[0]) as llm:
        return _generate(llm)[0]


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_oracle_head_drafts_all_accepted(models, reference, monkeypatch, runner):
    counts = _count_acceptance(monkeypatch)
    spec = {"method": "eagle", "model": models[1], "num_speculative_tokens": K}
    with _llm(models[0], spec, runner) as llm:
        assert _generate(llm)[0] == reference
        first = list(counts)
        # Same prompts again: prefix-cache hits (target and head KV share blocks).
        outs, cached = _generate(llm)
        assert outs == reference and cached[0] >= 32, cached  # two full blocks
    assert counts[0] > 0 and counts[1] == counts[0], counts
    # 13 tokens at up to K + 1 per step: most steps emit several tokens.
    assert first[1] >= 2 * len(PROMPTS) * (13 // (K + 1) - 1), first


def test_oracle_head_tp2(models, reference, monkeypatch):
    """V1 at TP=2 (V2 at TP=2: test_eagle.py's EAGLE-3 case)."""
    counts = _count_acceptance(monkeypatch)
    spec = {"method": "eagle", "model": models[1], "num_speculative_tokens": K}
    with _llm(models[0], spec, "v1", tensor_parallel_size=2) as llm:
        assert _generate(llm)[0] == reference
    assert counts[0] > 0 and counts[1] == counts[0], counts


def test_structured_outputs_stay_valid_with_eagle_drafts(models, monkeypatch):
    """JSON-schema requests, greedy and seeded random, with EAGLE drafts:
    every output parses against the schema. The oracle drafts the target's
    unconstrained argmax, which the grammar rejects: the scheduler must cut
    those drafts (grammar.validate_tokens) before they are verified (V2: the
    drafts go back to the scheduler as values, and the runner verifies only
    the grammar-valid prefix it kept)."""
    import json

    from vllm.sampling_params import StructuredOutputsParams
    from vllm.v1.spec_decode.eagle import EagleProposer
    from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator

    proposed: list[int] = []
    real = EagleProposer.propose
    real_v2 = EagleSpeculator.propose

    def spy(self, inputs):
        drafts = real(self, inputs)
        proposed.extend(len(d) for d in drafts)
        return drafts

    def spy_v2(self, *args):
        drafts, num_drafts = real_v2(self, *args)
        proposed.extend(num_drafts.tolist())
        return drafts, num_drafts

    monkeypatch.setattr(EagleProposer, "propose", spy)
    monkeypatch.setattr(EagleSpeculator, "propose", spy_v2)
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    so = StructuredOutputsParams(json=schema, disable_any_whitespace=True)
    params = [
        SamplingParams(temperature=t, seed=s, max_tokens=60, structured_outputs=so)
        for t, s in [(0.0, None), (0.8, 1), (1.2, 2)]
    ]
    spec = {"method": "eagle", "model": models[1], "num_speculative_tokens": K}
    with _llm(models[0], spec) as llm:  # V2 unless VLLM_USE_V2_MODEL_RUNNER=0
        prompt = llm.get_tokenizer().encode('{"ok":true,"n":7}\n' * 4, add_special_tokens=False)
        outs = llm.generate([{"prompt_token_ids": prompt}] * 3, params, use_tqdm=False)
    for out in outs:
        text = out.outputs[0].text
        assert out.outputs[0].finish_reason == "stop", text
        obj = json.loads(text)
        assert set(obj) == {"ok", "n"} and isinstance(obj["ok"], bool), obj
        assert type(obj["n"]) is int and obj["n"] >= 0, obj
    assert sum(proposed) > 0  # the head drafted; the grammar decided what was verified
