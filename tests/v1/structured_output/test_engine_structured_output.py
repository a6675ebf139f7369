"""Structured outputs end to end, offline: `LLM(...)` over a tiny random
qwen2 model (byte-level tokenizer: every character can be spelled).

A random model never "wants" to produce JSON, so a valid, *finished*
(finish_reason "stop") output shows that the bitmask reached the logits every
step and that the grammar advanced with every accepted token (a grammar that
lags one token allows the wrong continuation). Both model runners, the
synchronous step and the batch queue (async scheduling), and the
multiprocess executor (GrammarOutput crossing to worker processes).
"""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest

from vllm import LLM, SamplingParams
from vllm.sampling_params import StructuredOutputsParams
from vllm.v1.core.sched.output import GrammarOutput
from vllm.v1.executor.uniproc_executor import UniProcExecutor

SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "tag": {"type": "string", "maxLength": 6},
    },
    "required": ["ok", "color", "n", "tag"],
    "additionalProperties": False,
}
REGEX = r"[a-c]{3}-\d{2}"
CHOICES = ["alpha", "beta gamma", "delta"]
GRAMMAR = 'root ::= "(" num ("," num)? ")"\nnum ::= [0-9] [0-9]?'
GRAMMAR_RE = r"\(\d\d?(,\d\d?)?\)"
PROMPT = "Hello world"
UNSTRUCTURED = [
    SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
    SamplingParams(temperature=0.8, seed=7, max_tokens=10, ignore_eos=True),
]


def _check_json(text: str) -> None:
    obj = json.loads(text)
    assert isinstance(obj, dict) and set(obj) == set(SCHEMA["required"]), obj
    assert isinstance(obj["ok"], bool)
    assert obj["color"] in SCHEMA["properties"]["color"]["enum"]
    assert type(obj["n"]) is int and 0 <= obj["n"] <= 99
    assert isinstance(obj["tag"], str) and len(obj["tag"]) <= 6


CHECKS = {
    "json": _check_json,
    "regex": lambda text: re.fullmatch(REGEX, text) or pytest.fail(text),
    "choice": lambda text: text in CHOICES or pytest.fail(text),
    "grammar": lambda text: re.fullmatch(GRAMMAR_RE, text) or pytest.fail(text),
}


def _structured(kind: str, temperature: float = 0.0, seed: int | None = None) -> SamplingParams:
    so = {
        "json": StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True),
        "regex": StructuredOutputsParams(regex=REGEX),
        "choice": StructuredOutputsParams(choice=CHOICES),
        "grammar": StructuredOutputsParams(grammar=GRAMMAR),
    }[kind]
    return SamplingParams(temperature=temperature, seed=seed, max_tokens=64, structured_outputs=so)


# Each kind greedy and sampled, then the unstructured requests.
KINDS = [kind for kind in CHECKS for _ in range(2)]
MIXED = [
    _structured(kind, *((0.0, None) if i % 2 == 0 else (1.0, i))) for i, kind in enumerate(KINDS)
] + UNSTRUCTURED


def _generate(llm: LLM, params: list[SamplingParams]) -> list[tuple[str, list[int], str]]:
    outs = llm.generate([PROMPT] * len(params), params, use_tqdm=False)
    return [
        (o.outputs[0].text, list(o.outputs[0].token_ids), o.outputs[0].finish_reason) for o in outs
    ]


def _check_mixed(results: list[tuple[str, list[int], str]]) -> None:
    for kind, (text, _, finish_reason) in zip(KINDS, results):
        # "stop": the grammar terminated and only EOS was left to sample.
        assert finish_reason == "stop", (kind, text, finish_reason)
        CHECKS[kind](text)


class SlowUniProcExecutor(UniProcExecutor):
    """The real uniproc executor, each forward pass 20 ms longer, so that a
    step is still running when the next one is scheduled (the batch queue
    then holds two steps and structured steps must defer their sampling)."""

    def _call(self, method, args, kwargs):
        if method == "execute_model":
            time.sleep(0.02)
        return super()._call(method, args, kwargs)


def _make_llm(model_dir: str, runner: str, engine_process: bool = False, **kwargs) -> LLM:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1" if engine_process else "0")
        mp.setenv("VLLM_USE_V2_MODEL_RUNNER", runner)
        # A long prompt is prefilled 8 tokens a step while short ones decode:
        # the runners put decodes first, so batch rows differ from the
        # scheduler's order (see test_rows_follow_request_ids_...).
        return LLM(
            model=model_dir,
            dtype="float32",
            max_model_len=256,
            max_num_seqs=16,
            max_num_batched_tokens=64,
            long_prefill_token_threshold=8,
            seed=0,
            **kwargs,
        )


@pytest.fixture(scope="module", params=["0", "1"], ids=["v1", "v2"])
def runner(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def sync_llm(tiny_model_dir, runner):
    llm = _make_llm(tiny_model_dir("qwen2"), runner, async_scheduling=False)
    yield llm
    llm.llm_engine.shutdown()


@pytest.fixture(scope="module")
def sync_results(sync_llm):
    return _generate(sync_llm, MIXED)


def test_structured_outputs_are_valid_and_finish(sync_results):
    _check_mixed(sync_results)


def test_unstructured_batch_mates_get_their_own_tokens(sync_llm, sync_results):
    """Requests without a grammar are untouched by their structured batch-mates."""
    alone = _generate(sync_llm, UNSTRUCTURED)
    mixed = sync_results[len(KINDS) :]
    assert [tokens for _, tokens, _ in mixed] == [tokens for _, tokens, _ in alone]


def test_rows_follow_request_ids_when_the_batch_is_reordered(sync_llm):
    """A structured request mid-prefill ahead of decoding ones in the
    scheduler's order: the runner reorders the batch (decodes first), and each
    bitmask row must still reach its own request's logits."""
    from vllm.inputs import TokensPrompt

    long_prompt = TokensPrompt(prompt_token_ids=[(7 * i) % 500 + 1 for i in range(60)])
    kinds = ["regex", "json", "grammar", "choice"]
    params = [_structured(kind) for kind in kinds] + UNSTRUCTURED[:1]
    outs = sync_llm.generate([long_prompt] + [PROMPT] * (len(params) - 1), params, use_tqdm=False)
    for kind, out in zip(kinds, outs):
        assert out.outputs[0].finish_reason == "stop", (kind, out.outputs[0].text)
        CHECKS[kind](out.outputs[0].text)
    alone = _generate(sync_llm, UNSTRUCTURED[:1])[0][1]
    assert list(outs[-1].outputs[0].token_ids) == alone


def test_compile_failure_is_a_request_error(sync_llm, monkeypatch):
    """A constraint that passes validation but fails to compile finishes its
    request with finish_reason "error"; the engine and batch-mates carry on."""
    from vllm.v1.structured_output import backend_xgrammar

    monkeypatch.setattr(backend_xgrammar, "validate_xgrammar_grammar", lambda params: None)
    bad = SamplingParams(max_tokens=5, structured_outputs=StructuredOutputsParams(regex="foo**"))
    results = _generate(sync_llm, [bad, UNSTRUCTURED[0]])
    assert results[0] == ("", [], "error")
    assert results[1][2] == "length" and len(results[1][1]) == 10
    text, _, finish_reason = _generate(sync_llm, [_structured("regex")])[0]
    assert finish_reason == "stop" and re.fullmatch(REGEX, text)


def test_batch_queue_defers_sampling_until_grammars_advance(tiny_model_dir, runner, sync_results):
    """Async scheduling: each step's bitmask is built only once the grammars
    have taken the tokens of every step before it, while steps still overlap.
    Greedy outputs equal the synchronous engine's."""
    llm = _make_llm(
        tiny_model_dir("qwen2"),
        runner,
        async_scheduling=True,
        distributed_executor_backend=SlowUniProcExecutor,
    )
    try:
        core = llm.llm_engine.engine_core.engine_core
        assert core.batch_queue is not None
        scheduler = core.scheduler
        real = scheduler.get_grammar_bitmask
        bitmask_calls = {"with_rows": 0, "queue_busy": 0}

        def spy(scheduler_output):
            grammar_output = real(scheduler_output)
            if grammar_output is not None:
                bitmask_calls["with_rows"] += 1
                bitmask_calls["queue_busy"] += bool(core.batch_queue)
                for req_id in grammar_output.structured_output_request_ids:
                    # Only this step's own token may still be in flight.
                    assert scheduler.requests[req_id].num_output_placeholders <= 1
            return grammar_output

        scheduler.get_grammar_bitmask = spy
        results = _generate(llm, MIXED)
    finally:
        llm.llm_engine.shutdown()
    _check_mixed(results)
    assert bitmask_calls["with_rows"] > 0
    # Deferred sampling is queued only after the queue drained.
    assert bitmask_calls["queue_busy"] == 0
    greedy = [i for i in range(len(KINDS)) if i % 2 == 0] + [len(KINDS)]
    assert [results[i][1] for i in greedy] == [sync_results[i][1] for i in greedy]


def test_grammar_output_rpc_round_trip():
    """GrammarOutput crosses to the workers with the msgpack RPC codec (no pickle)."""
    from vllm.distributed.device_communicators.rpc_codec import RpcDecoder, RpcEncoder

    bitmask = np.arange(2 * 17, dtype=np.int32).reshape(2, 17) - 5
    frames = RpcEncoder().encode(("sample_tokens", (GrammarOutput(["a", "b"], bitmask),)))
    _, (decoded,) = RpcDecoder().decode(frames)
    assert isinstance(decoded, GrammarOutput)
    assert decoded.structured_output_request_ids == ["a", "b"]
    assert decoded.grammar_bitmask.dtype == np.int32
    np.testing.assert_array_equal(decoded.grammar_bitmask, bitmask)


def test_multiprocess_executor(tiny_model_dir, runner, sync_results):
    """Worker processes (tensor parallel 2) sample under the bitmask they
    received over the executor's message queue; greedy tokens equal the
    in-process engine's. Under V2 the engine core runs in its own process
    too (the constraints cross the front end's ZMQ sockets)."""
    engine_process = runner == "1"
    llm = _make_llm(
        tiny_model_dir("qwen2"),
        runner,
        engine_process=engine_process,
        distributed_executor_backend="mp",
        tensor_parallel_size=2,
    )
    try:
        if not engine_process:
            executor = llm.llm_engine.engine_core.engine_core.model_executor
            assert type(executor).__name__ == "MultiprocExecutor"
        results = _generate(llm, MIXED)
    finally:
        llm.llm_engine.shutdown()
    _check_mixed(results)
    greedy = [i for i in range(len(KINDS)) if i % 2 == 0]
    assert [results[i][1] for i in greedy] == [sync_results[i][1] for i in greedy]
