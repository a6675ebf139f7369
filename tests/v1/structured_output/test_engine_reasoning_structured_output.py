"""Structured outputs behind a reasoning parser, end to end through `LLM`
(engine core in its own process, so the per-request switches cross the wire):
a tiny random qwen2 model whose tokenizer has `<think>` / `</think>` tokens,
and an engine with structured_outputs_config.reasoning_parser="qwen3".

A random model never ends its reasoning by itself, so `logit_bias` on
`</think>` makes it do so at the first (unconstrained) step; after that the
grammar masks `</think>` away and must produce the regex."""

from __future__ import annotations

import re

import pytest

from tests.v1.structured_output.reasoning_utils import make_think_model
from vllm import LLM, SamplingParams
from vllm.sampling_params import StructuredOutputsParams

REGEX = "[0-9]{3}"
PROMPT = "User: pick a number\nAssistant: <think>\n"


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    model_dir = make_think_model("qwen2", str(tmp_path_factory.mktemp("think-model")))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
        llm = LLM(
            model=model_dir,
            dtype="float32",
            max_model_len=128,
            max_num_seqs=4,
            seed=0,
            structured_outputs_config={"reasoning_parser": "qwen3"},
        )
    yield llm
    llm.llm_engine.shutdown()


def params(constrained: bool = True, **kwargs) -> SamplingParams:
    so = StructuredOutputsParams(regex=REGEX) if constrained else None
    return SamplingParams(temperature=0.0, max_tokens=8, structured_outputs=so, **kwargs)


def end_token(llm: LLM) -> int:
    (token,) = llm.get_tokenizer().encode("</think>", add_special_tokens=False)
    return token


def run(llm: LLM, sampling_params: SamplingParams, **request_fields) -> tuple[str, str]:
    """One request through LLMEngine.add_request (which takes the reasoning
    fields); its (text, finish_reason)."""
    engine = llm.llm_engine
    engine.add_request("req", PROMPT, sampling_params, **request_fields)
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                return out.outputs[0].text, out.outputs[0].finish_reason
    raise AssertionError("the request never finished")


def test_reasoning_is_not_constrained(llm):
    """Before `</think>` the constrained request samples exactly what an
    unconstrained one does (which is not the regex's language)."""
    free = llm.generate([PROMPT], params(constrained=False), use_tqdm=False)[0].outputs[0]
    held = llm.generate([PROMPT], params(), use_tqdm=False)[0].outputs[0]
    assert "</think>" not in free.text
    assert not re.fullmatch(REGEX, free.text)
    assert list(held.token_ids) == list(free.token_ids)
    assert held.finish_reason == "length"


def test_content_after_the_reasoning_is_constrained(llm):
    bias = {end_token(llm): 100.0}
    text, finish_reason = run(llm, params(logit_bias=bias))
    assert text.startswith("</think>"), text
    assert re.fullmatch(REGEX, text.removeprefix("</think>")), text
    assert finish_reason == "stop"
    # The same bias without a grammar: the model would keep ending its reasoning.
    free, _ = run(llm, params(constrained=False, logit_bias=bias))
    assert free.startswith("</think></think>")


@pytest.mark.parametrize(
    "fields",
    [
        {"reasoning_parser_kwargs": {"chat_template_kwargs": {"enable_thinking": False}}},
        {"reasoning_ended": True},
    ],
    ids=["enable_thinking_false", "reasoning_ended"],
)
def test_grammar_from_the_first_token(llm, fields):
    text, finish_reason = run(llm, params(), **fields)
    assert re.fullmatch(REGEX, text), text
    assert finish_reason == "stop"
