"""n > 1: the ParentRequest fan-out and the gathering of the children's
outputs by the OutputProcessor (upstream: vllm/v1/engine/parallel_sampling.py)."""

from __future__ import annotations

import pytest

from tests.v1.engine.conftest import make_request
from vllm.outputs import CompletionOutput
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine import EngineCoreOutput, FinishReason
from vllm.v1.engine.output_processor import OutputProcessor
from vllm.v1.engine.parallel_sampling import ParentRequest


def _parent(n: int, kind: RequestOutputKind, seed: int | None = 5) -> ParentRequest:
    request = make_request(
        [1, 2, 3], request_id="abc-1234", external_req_id="abc", n=n, seed=seed, output_kind=kind
    )
    return ParentRequest(request)


def _completion(index: int, finished: bool) -> CompletionOutput:
    return CompletionOutput(
        index=index,
        text=f"t{index}",
        token_ids=[index],
        cumulative_logprob=None,
        logprobs=None,
        finish_reason="length" if finished else None,
    )


def test_child_ids_and_seeds():
    parent = _parent(3, RequestOutputKind.FINAL_ONLY)
    infos = [parent.get_child_info(i) for i in range(3)]
    assert [cid for cid, _ in infos] == ["0_abc-1234", "1_abc-1234", "2_abc-1234"]
    assert [p.seed for _, p in infos] == [5, 6, 7]
    assert all(p.n == 1 for _, p in infos)
    assert parent.sampling_params.n == 3 and parent.sampling_params.seed == 5
    unseeded = _parent(2, RequestOutputKind.FINAL_ONLY, seed=None)
    assert [unseeded.get_child_info(i)[1].seed for i in range(2)] == [None, None]


def test_final_only_waits_for_all_children_and_orders_them():
    parent = _parent(3, RequestOutputKind.FINAL_ONLY)
    ids = [parent.get_child_info(i)[0] for i in range(3)]
    assert parent.get_outputs(ids[2], _completion(2, True)) == ([], False)
    assert parent.get_outputs(ids[0], _completion(0, True)) == ([], False)
    outputs, finished = parent.get_outputs(ids[1], _completion(1, True))
    assert finished and [o.index for o in outputs] == [0, 1, 2]


def test_streaming_passes_each_child_through_once():
    parent = _parent(2, RequestOutputKind.DELTA)
    ids = [parent.get_child_info(i)[0] for i in range(2)]
    outputs, finished = parent.get_outputs(ids[1], _completion(1, False))
    assert [o.index for o in outputs] == [1] and not finished
    outputs, finished = parent.get_outputs(ids[1], _completion(1, True))
    assert [o.index for o in outputs] == [1] and not finished
    # A finished child reported again (e.g. an abort after its end) is not re-sent.
    assert parent.get_outputs(ids[1], _completion(1, True)) == ([], False)
    outputs, finished = parent.get_outputs(ids[0], _completion(0, True))
    assert [o.index for o in outputs] == [0] and finished


def _add_fanned_out(
    processor: OutputProcessor, n: int, kind: RequestOutputKind
) -> tuple[ParentRequest, list[str]]:
    request = make_request(
        [1, 2],
        request_id="p-0001",
        external_req_id="p",
        n=n,
        seed=1,
        output_kind=kind,
        max_tokens=4,
    )
    parent = ParentRequest(request)
    child_ids = []
    for i in range(n):
        child_id, child_params = parent.get_child_info(i)
        child = make_request(
            [1, 2], request_id=child_id, external_req_id="p", output_kind=kind, max_tokens=4
        )
        child.sampling_params = child_params
        processor.add_request(child, "hi", parent, i)
        child_ids.append(child_id)
    return parent, child_ids


@pytest.mark.parametrize("kind", list(RequestOutputKind))
def test_output_processor_gathers_children(tiny_tokenizer, kind):
    processor = OutputProcessor(tiny_tokenizer, log_stats=False)
    _, child_ids = _add_fanned_out(processor, 3, kind)
    tokens = {cid: [10 + i, 20 + i] for i, cid in enumerate(child_ids)}
    results = []
    # Children finish out of order: 2, then 0, then 1.
    for step in range(2):
        for cid in (child_ids[2], child_ids[0], child_ids[1]):
            finish = FinishReason.LENGTH if step == 1 else None
            eco = EngineCoreOutput(
                request_id=cid, new_token_ids=[tokens[cid][step]], finish_reason=finish
            )
            results.extend(processor.process_outputs([eco]).request_outputs)
    assert all(r.request_id == "p" for r in results)
    assert results[-1].finished and not processor.has_unfinished_requests()
    assert not processor.parent_requests
    if kind == RequestOutputKind.FINAL_ONLY:
        assert len(results) == 1
        assert [o.index for o in results[0].outputs] == [0, 1, 2]
        assert [o.token_ids for o in results[0].outputs] == [tokens[c] for c in child_ids]
    else:
        assert len(results) == 6 and all(len(r.outputs) == 1 for r in results)
        assert [r.finished for r in results] == [False] * 5 + [True]
        last = {r.outputs[0].index: r.outputs[0] for r in results}
        if kind == RequestOutputKind.CUMULATIVE:
            assert [last[i].token_ids for i in range(3)] == [tokens[c] for c in child_ids]


def test_aborting_the_parent_aborts_its_children(tiny_tokenizer):
    processor = OutputProcessor(tiny_tokenizer, log_stats=False)
    parent, child_ids = _add_fanned_out(processor, 3, RequestOutputKind.FINAL_ONLY)
    processor.process_outputs(
        [
            EngineCoreOutput(
                request_id=child_ids[1], new_token_ids=[5], finish_reason=FinishReason.LENGTH
            )
        ]
    )
    aborted = processor.abort_requests([parent.request_id], internal=True)
    assert sorted(aborted) == sorted([child_ids[0], child_ids[2]])
    assert not processor.has_unfinished_requests() and not processor.parent_requests
    # By the user's id: every child submitted under it.
    processor2 = OutputProcessor(tiny_tokenizer, log_stats=False)
    _, child_ids2 = _add_fanned_out(processor2, 2, RequestOutputKind.DELTA)
    assert sorted(processor2.abort_requests(["p"])) == sorted(child_ids2)
