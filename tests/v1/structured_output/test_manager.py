"""StructuredOutputManager on a tiny model: lazy backend, compilation in the
thread pool, compile errors captured on the request, and the per-step
bitmask in the requested order."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from tests.utils import TINY_VOCAB
from vllm.config import ModelConfig, VllmConfig
from vllm.sampling_params import SamplingParams, StructuredOutputsParams
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.structured_output.backend_xgrammar import XgrammarGrammar

EOS = 0
WORDS = (TINY_VOCAB + 31) // 32


@pytest.fixture(scope="module")
def vllm_config(tiny_model_dir):
    return VllmConfig(model_config=ModelConfig(model=tiny_model_dir("llama"), dtype="float32"))


@pytest.fixture
def manager(vllm_config):
    m = StructuredOutputManager(vllm_config)
    yield m
    m.clear_backend()


def make_request(req_id: str, backend: str | None = "xgrammar", **constraint) -> Request:
    so = StructuredOutputsParams(**constraint)
    so._backend = backend
    return Request(
        req_id, [1, 2, 3], SamplingParams(max_tokens=8, structured_outputs=so), eos_token_id=EOS
    )


def wait_ready(request: Request) -> None:
    """Poll as the scheduler does; the deadline only guards against a hang."""
    so = request.structured_output_request
    deadline = time.monotonic() + 60
    while not so.is_grammar_ready:
        assert time.monotonic() < deadline, "grammar compilation hung"
        time.sleep(0.005)


def own_row(grammar) -> np.ndarray:
    row = torch.zeros(1, WORDS, dtype=torch.int32)
    grammar.fill_bitmask(row, 0)
    return row[0].numpy()


def ids_of(row: np.ndarray) -> set[int]:
    return {t for t in range(len(row) * 32) if (int(row[t // 32]) >> (t % 32)) & 1}


def tok(manager, text: str) -> int:
    (token,) = manager.tokenizer.encode(text, add_special_tokens=False)
    return token


def test_grammar_compiles_in_the_pool(manager):
    assert manager.backend is None  # built on first use
    request = make_request("r0", regex="ab")
    manager.grammar_init(request)
    wait_ready(request)
    so = request.structured_output_request
    assert so.compile_error is None and isinstance(so.grammar, XgrammarGrammar)
    assert manager.backend is not None and manager.backend.vocab_size == TINY_VOCAB
    assert manager.should_advance(request)


def test_bitmask_rows_follow_the_given_order(manager):
    ra, rb = make_request("a", regex="a+"), make_request("b", choice=["b", "cd"])
    for r in (ra, rb):
        manager.grammar_init(r)
        wait_ready(r)
    requests = {"a": ra, "b": rb}
    mask = manager.grammar_bitmask(requests, ["b", "a"], {})
    assert mask.dtype == np.int32 and mask.shape == (2, WORDS)
    np.testing.assert_array_equal(mask[0], own_row(rb.structured_output_request.grammar))
    np.testing.assert_array_equal(mask[1], own_row(ra.structured_output_request.grammar))
    assert tok(manager, "a") in ids_of(mask[1]) and tok(manager, "a") not in ids_of(mask[0])
    assert manager.grammar_bitmask(requests, [], {}) is None


def test_terminated_request_gets_the_eos_only_row(manager):
    request = make_request("t", regex="a")
    manager.grammar_init(request)
    wait_ready(request)
    grammar = request.structured_output_request.grammar
    assert grammar.accept_tokens("t", [tok(manager, "a")])
    assert ids_of(manager.grammar_bitmask({"t": request}, ["t"], {})[0]) == {EOS}
    assert grammar.accept_tokens("t", [EOS]) and grammar.is_terminated()
    assert ids_of(manager.grammar_bitmask({"t": request}, ["t"], {})[0]) == {EOS}


def test_spec_tokens_get_one_row_each_and_state_is_restored(manager):
    request = make_request("s", regex="ab")
    manager.grammar_init(request)
    wait_ready(request)
    mask = manager.grammar_bitmask({"s": request}, ["s"], {"s": [tok(manager, "a")]})
    assert mask.shape == (2, WORDS)
    assert tok(manager, "a") in ids_of(mask[0]) and ids_of(mask[1]) == {tok(manager, "b")}
    assert request.structured_output_request.grammar.num_processed_tokens == 0


@pytest.mark.parametrize(
    "constraint,message",
    [
        (dict(regex="foo**"), "repetition"),
        (dict(json='{"type": "intege"}'), "intege"),
        (dict(grammar="root ::= nothing"), "not defined"),
    ],
)
def test_compile_errors_land_on_the_request(manager, constraint, message):
    bad = make_request("bad", **constraint)
    manager.grammar_init(bad)  # never raises
    wait_ready(bad)
    so = bad.structured_output_request
    assert so.grammar is None and so.compile_error is not None and message in so.compile_error
    assert not manager.should_advance(bad)
    good = make_request("good", regex="x")  # the manager keeps working
    manager.grammar_init(good)
    wait_ready(good)
    assert good.structured_output_request.compile_error is None


def test_unbuilt_backend_is_a_compile_error(manager):
    request = make_request("g", backend="guidance", regex="a")
    manager.grammar_init(request)
    assert request.structured_output_request.is_grammar_ready
    assert "not built in this implementation" in request.structured_output_request.compile_error


def test_skip_tokenizer_init_is_refused(tiny_model_dir):
    config = VllmConfig(
        model_config=ModelConfig(
            model=tiny_model_dir("llama"), dtype="float32", skip_tokenizer_init=True
        )
    )
    request = make_request("k", regex="a")
    StructuredOutputManager(config).grammar_init(request)
    assert "skip_tokenizer_init" in request.structured_output_request.compile_error


def test_plain_request_is_not_advanced(manager):
    plain = Request("p", [1], SamplingParams(max_tokens=4), eos_token_id=EOS)
    manager.grammar_init(plain)  # nothing to do
    assert not manager.should_advance(plain)


def test_clear_backend_and_rebuild(manager):
    request = make_request("c", json_object=True)
    manager.grammar_init(request)
    wait_ready(request)
    manager.clear_backend()
    assert manager.backend is None
    again = make_request("c2", json_object=True)
    manager.grammar_init(again)
    wait_ready(again)
    assert again.structured_output_request.grammar is not None


def test_gguf_model_tokenizer(embedded_model_path):
    """The tokenizer comes from the engine's loader, GGUF files included."""
    config = VllmConfig(model_config=ModelConfig(model=embedded_model_path))
    manager = StructuredOutputManager(config)
    request = make_request(
        "g", json={"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    )
    manager.grammar_init(request)
    wait_ready(request)
    grammar = request.structured_output_request.grammar
    assert grammar is not None
    tokenizer = manager.tokenizer
    assert grammar.accept_tokens("g", tokenizer.encode('{"a": 12}', add_special_tokens=False))
    mask = manager.grammar_bitmask({"g": request}, ["g"], {})
    assert mask.shape == (1, (config.model_config.get_vocab_size() + 31) // 32)
    assert ids_of(mask[0]) == {tokenizer.eos_token_id}
    manager.clear_backend()


def test_request_state_without_the_manager():
    from concurrent.futures import Future

    from vllm.v1.structured_output.request import StructuredOutputRequest

    assert StructuredOutputRequest.from_sampling_params(SamplingParams()) is None
    so = StructuredOutputRequest.from_sampling_params(
        SamplingParams(structured_outputs=StructuredOutputsParams(choice=["a", "b"]))
    )
    assert so is not None and so.structured_output_key[1] == '["a", "b"]'
    assert so.is_grammar_ready is False and so.grammar is None  # nothing started
    future: Future = Future()
    so.grammar = future
    assert not so.is_grammar_ready and so.grammar is None
    future.cancel()  # a pool shut down before compiling it
    assert so.is_grammar_ready and so.grammar is None
    assert "cancelled" in so.compile_error
    failed = StructuredOutputRequest(StructuredOutputsParams(regex="a"))
    future = Future()
    failed.grammar = future
    future.set_exception(ValueError("boom"))
    assert failed.is_grammar_ready and failed.compile_error == "ValueError: boom"


def test_bitmask_is_a_copy(manager):
    request = make_request("cp", regex="a")
    manager.grammar_init(request)
    wait_ready(request)
    first = manager.grammar_bitmask({"cp": request}, ["cp"], {})
    kept = first.copy()
    request.structured_output_request.grammar.accept_tokens("cp", [tok(manager, "a")])
    manager.grammar_bitmask({"cp": request}, ["cp"], {})  # reuses the buffer
    np.testing.assert_array_equal(first, kept)
