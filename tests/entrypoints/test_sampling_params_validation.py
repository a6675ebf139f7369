"""Every value upstream rejects is a clear error naming its parameter, raised
before the request reaches the engine core, which keeps serving the others
(upstream: tests/test_sampling_params.py, tests/v1/engine/test_processor.py)."""

from __future__ import annotations

import math

import pytest

from tests.entrypoints.utils import make_inproc_llm
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError

GREEDY = dict(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPT = {"prompt_token_ids": [4, 8, 15, 16, 23, 42]}


@pytest.mark.parametrize(
    "parameter, kwargs",
    [
        ("n", dict(n=0)),
        ("n", dict(n=2.0)),
        ("presence_penalty", dict(presence_penalty=2.5)),
        ("frequency_penalty", dict(frequency_penalty=-2.1)),
        ("frequency_penalty", dict(frequency_penalty=math.nan)),
        ("repetition_penalty", dict(repetition_penalty=0.0)),
        ("repetition_penalty", dict(repetition_penalty=math.inf)),
        ("temperature", dict(temperature=-0.5)),
        ("temperature", dict(temperature=math.nan)),
        ("top_p", dict(top_p=0.0)),
        ("top_p", dict(top_p=1.01)),
        ("top_k", dict(top_k=-2)),
        ("top_k", dict(top_k=2.5)),
        ("min_p", dict(min_p=-0.01)),
        ("min_p", dict(min_p=1.5)),
        ("seed", dict(seed=2**64)),
        ("max_tokens", dict(max_tokens=0)),
        ("min_tokens", dict(min_tokens=-1)),
        ("min_tokens", dict(min_tokens=9, max_tokens=8)),
        ("logprobs", dict(logprobs=-2)),
        ("prompt_logprobs", dict(prompt_logprobs=-5)),
        ("stop", dict(stop=["ok", ""])),
        ("stop", dict(stop="x", detokenize=False)),
        ("stop_token_ids", dict(stop_token_ids=[1, "2"])),
        ("bad_words", dict(bad_words=["fine", ""])),
        ("logit_bias", dict(logit_bias={"seven": 1.0})),
        ("logit_bias", dict(logit_bias={7: math.inf})),
    ],
)
def test_sampling_params_rejects(parameter, kwargs):
    with pytest.raises(VLLMValidationError) as exc:
        SamplingParams(**kwargs)
    assert exc.value.parameter == parameter
    assert parameter.split("_")[0] in str(exc.value)


def test_accepted_edge_values():
    sp = SamplingParams(
        top_k=-1,
        seed=-1,
        temperature=0.001,
        logprobs=True,
        stop="x",
        stop_token_ids=[5, 5, 6],
        bad_words=["a", "a"],
        logit_bias={"3": 2},
    )
    assert sp.top_k == -1 and sp.seed is None and sp.temperature == 0.01
    assert sp.logprobs == 1 and sp.stop == ["x"] and sp.output_text_buffer_length == 0
    assert sp.stop_token_ids == [5, 6] and sp.bad_words == ["a"]
    assert sp.logit_bias == {3: 2.0}
    assert SamplingParams.from_optional(logit_bias={"3": 500}).logit_bias == {3: 100.0}
    greedy = SamplingParams(temperature=0.0, top_p=0.5, top_k=3, min_p=0.2, n=2)
    assert (greedy.top_p, greedy.top_k, greedy.min_p) == (1.0, 0, 0.0)


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return make_inproc_llm(tiny_model_dir("llama"))


# Values only the engine can judge (they depend on the model and tokenizer).
ENGINE_REJECTS = [
    ("logprobs", dict(logprobs=21), "greater than max allowed: 20"),
    ("prompt_logprobs", dict(prompt_logprobs=21), "greater than max allowed: 20"),
    ("logit_bias", dict(logit_bias={512: 1.0}), "out-of-vocab"),
    ("allowed_token_ids", dict(allowed_token_ids=[]), "empty"),
    ("allowed_token_ids", dict(allowed_token_ids=[1, 512]), "out-of-vocab"),
    ("stop_token_ids", dict(stop_token_ids=[600]), "out-of-vocab"),
    ("bad_words", dict(bad_words=["   "]), "at least one token"),
]


@pytest.mark.parametrize("parameter, kwargs, message", ENGINE_REJECTS)
def test_engine_rejects_and_keeps_serving(llm, parameter, kwargs, message):
    engine = llm.llm_engine
    (alone,) = llm.generate(PROMPT, SamplingParams(**GREEDY), use_tqdm=False)
    # A request already running when the bad one arrives is not disturbed.
    engine.add_request("good", PROMPT, SamplingParams(**GREEDY))
    engine.step()
    with pytest.raises(VLLMValidationError, match=message) as exc:
        engine.add_request("bad", PROMPT, SamplingParams(**GREEDY, **kwargs))
    assert exc.value.parameter == parameter
    outputs = []
    while engine.has_unfinished_requests():
        outputs += [o for o in engine.step() if o.finished]
    assert [o.request_id for o in outputs] == ["good"]
    assert outputs[0].outputs[0].token_ids == alone.outputs[0].token_ids
    # In a batch: the call fails as a whole and leaves nothing behind.
    with pytest.raises(VLLMValidationError):
        llm.generate(
            [PROMPT, PROMPT],
            [SamplingParams(**GREEDY), SamplingParams(**GREEDY, **kwargs)],
            use_tqdm=False,
        )
    assert engine.get_num_unfinished_requests() == 0
    assert not engine.engine_core.engine_core.scheduler.has_unfinished_requests()


def test_priority_needs_the_priority_policy(llm):
    """Under FCFS (the default) a non-zero priority would be silently
    ignored: upstream refuses it, and so do we; 0 is fine."""
    with pytest.raises(VLLMValidationError, match="Priority scheduling is not enabled") as exc:
        llm.generate([PROMPT], SamplingParams(**GREEDY), priority=[1], use_tqdm=False)
    assert exc.value.parameter == "priority"
    (out,) = llm.generate([PROMPT], SamplingParams(**GREEDY), priority=[0], use_tqdm=False)
    assert len(out.outputs[0].token_ids) == GREEDY["max_tokens"]
    assert llm.llm_engine.get_num_unfinished_requests() == 0
