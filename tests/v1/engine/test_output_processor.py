"""OutputProcessor fed hand-made EngineCoreOutputs
(upstream: tests/v1/engine/test_output_processor.py)."""

from __future__ import annotations

import math

import pytest

from tests.v1.engine.conftest import make_request
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine import EngineCoreOutput, FinishReason
from vllm.v1.engine.output_processor import OutputProcessor
from vllm.v1.outputs import LogprobsLists

TEXT = "The quick brown fox jumps over the lazy dog. héllo 日本語"


def _outputs(
    req_id: str, ids: list[int], finish_last: FinishReason | None = FinishReason.LENGTH, **kwargs
) -> list[EngineCoreOutput]:
    """One EngineCoreOutput per token; the last one finishes the request."""
    outs = [EngineCoreOutput(request_id=req_id, new_token_ids=[t], **kwargs) for t in ids]
    outs[-1].finish_reason = finish_last
    return outs


def _run(processor: OutputProcessor, outs: list[EngineCoreOutput]):
    """Feed outputs one step at a time; collect RequestOutputs and aborts."""
    results, aborts = [], []
    for eco in outs:
        processed = processor.process_outputs([eco])
        results.extend(processed.request_outputs)
        aborts.extend(processed.reqs_to_abort)
    return results, aborts


@pytest.mark.parametrize("kind", list(RequestOutputKind))
def test_output_kinds(tiny_tokenizer, kind):
    ids = tiny_tokenizer.encode(TEXT)
    processor = OutputProcessor(tiny_tokenizer, log_stats=False)
    processor.add_request(make_request([5, 6], output_kind=kind, max_tokens=len(ids)), prompt="hi")
    results, aborts = _run(processor, _outputs("r0", ids))
    assert not aborts and not processor.has_unfinished_requests()
    final = results[-1]
    assert final.finished and final.prompt == "hi" and final.prompt_token_ids == [5, 6]
    assert final.outputs[0].finish_reason == "length"
    assert all(not r.finished for r in results[:-1])
    if kind == RequestOutputKind.FINAL_ONLY:
        assert len(results) == 1
        assert final.outputs[0].text == TEXT and final.outputs[0].token_ids == ids
    elif kind == RequestOutputKind.CUMULATIVE:
        assert len(results) == len(ids)
        assert final.outputs[0].text == TEXT and final.outputs[0].token_ids == ids
        assert all(TEXT.startswith(r.outputs[0].text) for r in results)
    else:
        assert len(results) == len(ids)
        texts = [r.outputs[0].text for r in results]
        assert all("\ufffd" not in t for t in texts)
        assert "".join(texts) == TEXT == tiny_tokenizer.decode(ids)
        assert [t for r in results for t in r.outputs[0].token_ids] == ids


def test_stop_string_finishes_and_asks_the_core_to_abort(tiny_tokenizer):
    ids = tiny_tokenizer.encode(TEXT)
    processor = OutputProcessor(tiny_tokenizer, log_stats=False)
    processor.add_request(
        make_request([5], output_kind=RequestOutputKind.DELTA, stop=["jumps"]), prompt=None
    )
    results, aborts = _run(processor, _outputs("r0", ids, finish_last=None))
    final = results[-1]
    assert final.finished
    assert final.outputs[0].finish_reason == "stop"
    assert final.outputs[0].stop_reason == "jumps"
    assert "".join(r.outputs[0].text for r in results) == "The quick brown fox "
    # The core still runs the request: it must be aborted there, once.
    assert aborts == ["r0"]
    assert not processor.has_unfinished_requests()


def test_stop_token_from_the_core(tiny_tokenizer):
    ids = tiny_tokenizer.encode("The quick brown fox")
    processor = OutputProcessor(tiny_tokenizer, log_stats=False)
    processor.add_request(
        make_request([5], output_kind=RequestOutputKind.FINAL_ONLY, stop_token_ids=[ids[-1]]),
        prompt=None,
    )
    outs = _outputs("r0", ids, finish_last=FinishReason.STOP)
    outs[-1].stop_reason = ids[-1]
    results, aborts = _run(processor, outs)
    (final,) = results
    assert final.outputs[0].text == "The quick brown"  # the stop token's text is hidden
    assert final.outputs[0].token_ids == ids
    assert final.outputs[0].stop_reason == ids[-1]
    assert aborts == []


def test_abort_by_external_id_and_late_outputs_are_ignored(tiny_tokenizer):
    processor = OutputProcessor(tiny_tokenizer, log_stats=False)
    processor.add_request(make_request([5], request_id="a-1", external_req_id="a"), None)
    processor.add_request(make_request([5], request_id="a-2", external_req_id="a"), None)
    processor.add_request(make_request([5], request_id="b-1", external_req_id="b"), None)
    assert processor.get_num_unfinished_requests() == 3
    assert sorted(processor.abort_requests(["a"])) == ["a-1", "a-2"]
    assert processor.abort_requests(["a-1"], internal=True) == []
    processed = processor.process_outputs(
        [EngineCoreOutput("a-1", [7]), EngineCoreOutput("b-1", [7])]
    )
    assert [o.request_id for o in processed.request_outputs] == ["b"]


def test_sample_logprobs_become_dicts(tiny_tokenizer):
    processor = OutputProcessor(tiny_tokenizer, log_stats=False)
    processor.add_request(
        make_request([5], logprobs=1, max_tokens=2, output_kind=RequestOutputKind.FINAL_ONLY), None
    )
    # Per position: the sampled token first, then the top-1.
    step1 = LogprobsLists([[10, 11]], [[-0.5, -0.1]], [2])
    step2 = LogprobsLists([[12, 12]], [[-0.2, -0.2]], [1])
    outs = [
        EngineCoreOutput("r0", [10], new_logprobs=step1),
        EngineCoreOutput("r0", [12], new_logprobs=step2, finish_reason=FinishReason.LENGTH),
    ]
    (final,) = _run(processor, outs)[0]
    completion = final.outputs[0]
    assert math.isclose(completion.cumulative_logprob, -0.7)
    first, second = completion.logprobs
    assert set(first) == {10, 11} and first[10].rank == 2 and first[11].rank == 1
    assert first[11].decoded_token == tiny_tokenizer.decode([11])
    assert set(second) == {12} and second[12].rank == 1


def test_stream_interval_batches_delta_outputs(tiny_tokenizer):
    ids = tiny_tokenizer.encode(TEXT)
    processor = OutputProcessor(tiny_tokenizer, log_stats=False, stream_interval=4)
    processor.add_request(make_request([5], output_kind=RequestOutputKind.DELTA), None)
    results, _ = _run(processor, _outputs("r0", ids))
    # The first token, then every 4th, then the final output.
    assert len(results) == 1 + (len(ids) - 1) // 4 + (1 if (len(ids) - 1) % 4 else 0)
    assert [t for r in results for t in r.outputs[0].token_ids] == ids
    assert "".join(r.outputs[0].text for r in results) == TEXT


def test_duplicate_request_id_is_rejected(tiny_tokenizer):
    processor = OutputProcessor(tiny_tokenizer, log_stats=False)
    processor.add_request(make_request([5]), None)
    with pytest.raises(ValueError, match="already running"):
        processor.add_request(make_request([5]), None)
