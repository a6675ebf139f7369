"""StructuredOutputManager with a reasoning parser, on real requests, a real
tokenizer and compiled xgrammar grammars: the bitmask is all-ones while the
model reasons, the grammar takes no reasoning token (nor the end marker), and
it constrains from the first token after the reasoning; the per-request
switches (reasoning_ended, reasoning_parser_kwargs) and enable_in_reasoning."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from tests.utils import TINY_VOCAB
from tests.v1.structured_output.reasoning_utils import make_think_model
from vllm.config import ModelConfig, StructuredOutputsConfig, VllmConfig
from vllm.sampling_params import SamplingParams, StructuredOutputsParams
from vllm.v1.engine import EngineCoreRequest
from vllm.v1.request import Request
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder
from vllm.v1.structured_output import StructuredOutputManager

WORDS = (TINY_VOCAB + 31) // 32
REGEX = "[0-9]{3}"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_think_model("qwen2", str(tmp_path_factory.mktemp("think-model")))


def make_manager(model_dir: str, **so_config) -> StructuredOutputManager:
    config = VllmConfig(
        model_config=ModelConfig(model=model_dir, dtype="float32"),
        structured_outputs_config=StructuredOutputsConfig(**so_config),
    )
    return StructuredOutputManager(config)


def make_request(manager, prompt: str, **fields) -> Request:
    so = StructuredOutputsParams(regex=REGEX)
    so._backend = "xgrammar"
    ids = manager.tokenizer.encode(prompt, add_special_tokens=False)
    params = SamplingParams(max_tokens=32, structured_outputs=so)
    request = Request(f"r{time.monotonic_ns()}", ids, params, eos_token_id=0, **fields)
    manager.grammar_init(request)
    deadline = time.monotonic() + 60
    while not request.structured_output_request.is_grammar_ready:
        assert time.monotonic() < deadline, "grammar compilation hung"
        time.sleep(0.005)
    return request


def row(manager, request) -> np.ndarray:
    return manager.grammar_bitmask({request.request_id: request}, [request.request_id], {})[0]


def all_allowed(bitmask_row: np.ndarray) -> bool:
    return bool((bitmask_row == -1).all())


def grammar_start_row(request) -> np.ndarray:
    """The bitmask of the request's grammar in its current state."""
    out = torch.zeros(1, WORDS, dtype=torch.int32)
    request.structured_output_request.grammar.fill_bitmask(out, 0)
    return out[0].numpy()


def step(manager, request, text: str) -> bool:
    """Append `text`'s tokens as one step's output; True if the manager fed them
    to the grammar (as the scheduler's advance does)."""
    ids = manager.tokenizer.encode(text, add_special_tokens=False)
    request.append_output_token_ids(ids)
    if manager.should_advance(request, ids):
        assert request.structured_output_request.grammar.accept_tokens(request.request_id, ids)
        return True
    return False


@pytest.fixture(scope="module")
def r1_manager(model_dir):
    manager = make_manager(model_dir, reasoning_parser="deepseek_r1")
    yield manager
    manager.clear_backend()


def test_grammar_waits_for_the_end_of_reasoning(r1_manager):
    request = make_request(r1_manager, "User: hi\nAssistant: <think>\n")
    first = grammar_start_row(request)
    assert not all_allowed(first)  # the regex allows digits only
    for text in ["Let me see", " about it", "</think>"]:
        assert all_allowed(row(r1_manager, request)), text
        assert not step(r1_manager, request, text), text  # reasoning: the grammar is idle
    assert request.structured_output_request.reasoning_ended is True
    # The first token after the end marker is constrained, from the grammar's start.
    assert np.array_equal(row(r1_manager, request), first)
    assert step(r1_manager, request, "12")
    constrained = row(r1_manager, request)
    assert not all_allowed(constrained) and not np.array_equal(constrained, first)


def test_reasoning_ended_in_the_prompt_constrains_from_the_first_token(r1_manager):
    request = make_request(r1_manager, "<think>done</think>\n")
    assert np.array_equal(row(r1_manager, request), grammar_start_row(request))
    assert step(r1_manager, request, "1")


def test_front_end_reasoning_ended_wins_over_the_prompt(r1_manager):
    request = make_request(r1_manager, "<think>\n", reasoning_ended=True)
    assert np.array_equal(row(r1_manager, request), grammar_start_row(request))
    assert step(r1_manager, request, "7")


def test_text_markers_in_pieces(tiny_model_dir):
    """A tokenizer without `</think>` as a token: the end is seen when its last
    piece arrives, and no earlier."""
    manager = make_manager(tiny_model_dir("llama"), reasoning_parser="deepseek_r1")
    try:
        request = make_request(manager, "<think>\n")
        assert all_allowed(row(manager, request))
        ids = manager.tokenizer.encode("hmm</think>", add_special_tokens=False)
        assert len(ids) > 2
        for i, token in enumerate(ids):
            request.append_output_token_ids([token])
            assert not manager.should_advance(request, [token])
            ended = request.structured_output_request.reasoning_ended
            assert ended is (i == len(ids) - 1), (i, ids)
        assert np.array_equal(row(manager, request), grammar_start_row(request))
    finally:
        manager.clear_backend()


def test_enable_thinking_false_starts_the_grammar_at_the_first_token(model_dir):
    manager = make_manager(model_dir, reasoning_parser="qwen3")
    try:
        prompt = "<|im_start|>assistant\n<think>\n"
        thinking = make_request(manager, prompt)
        assert all_allowed(row(manager, thinking))
        off = {"chat_template_kwargs": {"enable_thinking": False}}
        request = make_request(manager, prompt, reasoning_parser_kwargs=off)
        assert np.array_equal(row(manager, request), grammar_start_row(request))
        assert step(manager, request, "4")
        # The request got its own parser; the other one the shared parser.
        assert request.structured_output_request.reasoner.thinking_enabled is False
        assert thinking.structured_output_request.reasoner is None
    finally:
        manager.clear_backend()


def test_enable_in_reasoning_constrains_the_reasoning_too(model_dir):
    manager = make_manager(model_dir, reasoning_parser="deepseek_r1", enable_in_reasoning=True)
    try:
        request = make_request(manager, "<think>\n")
        assert np.array_equal(row(manager, request), grammar_start_row(request))
        assert step(manager, request, "1")
    finally:
        manager.clear_backend()


def test_without_a_parser_the_grammar_applies_from_the_start(model_dir):
    manager = make_manager(model_dir)
    try:
        request = make_request(manager, "<think>\n", reasoning_ended=False)
        assert manager.reasoner_cls is None
        assert np.array_equal(row(manager, request), grammar_start_row(request))
    finally:
        manager.clear_backend()


def test_unknown_parser_is_refused_with_the_list():
    with pytest.raises(ValueError, match="no_such_parser") as info:
        StructuredOutputsConfig(reasoning_parser="no_such_parser")
    assert all(name in str(info.value) for name in ("deepseek_r1", "qwen3", "granite", "mistral"))


def test_parser_plugin_is_imported(tmp_path):
    plugin = tmp_path / "so_reasoning_plugin.py"
    plugin.write_text(
        "from vllm.reasoning import ReasoningParserManager\n"
        "from vllm.reasoning.deepseek_r1_reasoning_parser import DeepSeekR1ReasoningParser as P\n"
        "ReasoningParserManager.register_module('so_test_plugin', module=P)\n"
    )
    from vllm.reasoning import ReasoningParserManager

    try:
        config = StructuredOutputsConfig(
            reasoning_parser="so_test_plugin", reasoning_parser_plugin=str(plugin)
        )
        assert config.reasoning_parser == "so_test_plugin"
    finally:
        ReasoningParserManager.reasoning_parsers.pop("so_test_plugin", None)


def test_reasoning_fields_cross_the_wire():
    """EngineCoreRequest carries both fields to the engine-core process."""
    request = EngineCoreRequest(
        request_id="x",
        prompt_token_ids=[1],
        mm_features=None,
        sampling_params=None,
        pooling_params=None,
        eos_token_id=0,
        arrival_time=0.0,
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
        reasoning_ended=True,
        reasoning_parser_kwargs={"chat_template_kwargs": {"enable_thinking": False}},
    )
    decoded = MsgpackDecoder(EngineCoreRequest).decode(MsgpackEncoder().encode(request))
    assert decoded.reasoning_ended is True
    assert decoded.reasoning_parser_kwargs == {"chat_template_kwargs": {"enable_thinking": False}}
