"""The scheduler's side of structured outputs, step by step: requests wait for
their grammar without blocking others, a failed compile is a request error,
the bitmask covers only requests that sample, and grammars advance with the
accepted tokens. Grammars are real xgrammar grammars over a tiny byte-level
tokenizer; compilation is driven by hand through the request's Future (what
StructuredOutputManager.grammar_init sets)."""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np
import pytest

from tests.utils import make_tiny_tokenizer
from tests.v1.core.scheduler_utils import create_scheduler, make_model_runner_output, make_request
from vllm.config import VllmConfig
from vllm.sampling_params import StructuredOutputsParams
from vllm.v1.engine import FinishReason
from vllm.v1.request import RequestStatus
from vllm.v1.structured_output.backend_types import StructuredOutputOptions


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return make_tiny_tokenizer(str(tmp_path_factory.mktemp("sched-so-tokenizer")))


@pytest.fixture(scope="module")
def backend(tokenizer):
    from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend

    return XgrammarBackend(VllmConfig(), tokenizer=tokenizer, vocab_size=len(tokenizer))


def _structured_request(req_id: str, regex: str, num_tokens: int = 10):
    request = make_request(
        req_id, num_tokens=num_tokens, structured_outputs=(StructuredOutputsParams(regex=regex))
    )
    assert request.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
    future: Future = Future()
    request.structured_output_request.grammar = future
    return request, future


def _allowed(bitmask_row: np.ndarray, token_id: int) -> bool:
    return bool((int(bitmask_row[token_id // 32]) >> (token_id % 32)) & 1)


def test_compiling_grammar_does_not_block_others(backend):
    scheduler = create_scheduler()
    waiting, future = _structured_request("1", "ab")
    scheduler.add_request(waiting)
    scheduler.add_request(make_request("2"))
    output = scheduler.schedule()
    assert list(output.num_scheduled_tokens) == ["2"]
    assert not output.has_structured_output_requests
    assert waiting.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
    assert scheduler.waiting.peek_request() is waiting  # still first in line
    scheduler.update_from_output(output, make_model_runner_output(scheduler, output))

    future.set_result(backend.compile_grammar(StructuredOutputOptions.REGEX, "ab"))
    output = scheduler.schedule()
    assert "1" in output.num_scheduled_tokens and waiting.status == RequestStatus.RUNNING
    assert output.has_structured_output_requests


def test_failed_compile_finishes_request_with_error():
    scheduler = create_scheduler()
    request, future = _structured_request("1", "ab")
    scheduler.add_request(request)
    scheduler.add_request(make_request("2"))
    future.set_exception(ValueError("cannot compile"))
    output = scheduler.schedule()
    assert list(output.num_scheduled_tokens) == ["2"]
    assert request.status == RequestStatus.FINISHED_ERROR and "1" not in scheduler.requests
    assert "1" in output.finished_req_ids  # the workers hear of it
    outputs = scheduler.update_from_output(output, make_model_runner_output(scheduler, output))
    finished = {o.request_id: o.finish_reason for o in outputs[0].outputs}
    assert finished["1"] == FinishReason.ERROR
    assert scheduler.get_request_counts() == (1, 0)


def test_bitmask_only_for_sampling_requests_and_grammar_advances(backend, tokenizer):
    scheduler = create_scheduler(max_num_batched_tokens=8, max_num_seqs=4, max_model_len=64)
    scheduler.structured_output_manager.backend = backend
    request, future = _structured_request("1", "ab", num_tokens=12)
    future.set_result(backend.compile_grammar(StructuredOutputOptions.REGEX, "ab"))
    scheduler.add_request(request)
    a, b = tokenizer.convert_tokens_to_ids(["a", "b"])

    output = scheduler.schedule()  # 8 of 12 prompt tokens: nothing sampled
    assert output.has_structured_output_requests
    assert scheduler.get_grammar_bitmask(output) is None
    scheduler.update_from_output(output, make_model_runner_output(scheduler, output))

    output = scheduler.schedule()  # the rest of the prompt: samples
    grammar_output = scheduler.get_grammar_bitmask(output)
    assert grammar_output.structured_output_request_ids == ["1"]
    row = grammar_output.grammar_bitmask[0]
    assert _allowed(row, a) and not _allowed(row, b)
    scheduler.update_from_output(
        output, make_model_runner_output(scheduler, output, sampled={"1": [a]})
    )

    output = scheduler.schedule()
    row = scheduler.get_grammar_bitmask(output).grammar_bitmask[0]
    assert _allowed(row, b) and not _allowed(row, a)  # the grammar took "a"


def test_async_scheduling_counts_the_in_flight_token(backend, tokenizer):
    """With a step in flight the request still samples in the next one."""
    scheduler = create_scheduler(async_scheduling=True)
    scheduler.structured_output_manager.backend = backend
    request, future = _structured_request("1", "ab", num_tokens=4)
    future.set_result(backend.compile_grammar(StructuredOutputOptions.REGEX, "ab"))
    scheduler.add_request(request)
    first = scheduler.schedule()
    second = scheduler.schedule()  # scheduled before the first step's token is in
    assert request.num_output_placeholders == 2
    first_out = make_model_runner_output(
        scheduler, first, sampled={"1": tokenizer.convert_tokens_to_ids(["a"])}
    )
    scheduler.update_from_output(first, first_out)
    grammar_output = scheduler.get_grammar_bitmask(second)
    assert grammar_output.structured_output_request_ids == ["1"]
    assert _allowed(grammar_output.grammar_bitmask[0], tokenizer.convert_tokens_to_ids("b"))
