"""The async scheduler with speculative decoding (scheduler level; the V1
runner's side is tests/v1/spec_decode/test_async_spec_e2e.py). A step is
scheduled before the previous one's drafts are known, so each decoding
request carries placeholder drafts (-1) and 1 + drafts output placeholders
per step in flight; the output of a step gives back one placeholder per token
emitted and one per rejected draft. The runner's drafts reach the scheduler
only for a structured-output step (update_draft_token_ids_in_output)."""

import random
from collections import deque

import pytest

from tests.v1.core.scheduler_utils import create_requests, create_scheduler, make_request
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.engine import FinishReason
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
from vllm.v1.request import RequestStatus

pytestmark = pytest.mark.cpu_test


def runner_output(out: SchedulerOutput, sampled: list[list[int]]) -> ModelRunnerOutput:
    req_ids = list(out.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=sampled,
    )


def test_placeholders_count_drafts():
    scheduler = create_scheduler(async_scheduling=True, num_speculative_tokens=3)
    assert isinstance(scheduler, AsyncScheduler)
    request = make_request("0", num_tokens=10, max_tokens=50)
    scheduler.add_request(request)
    out1 = scheduler.schedule()  # the prompt; samples one token
    assert request.num_output_placeholders == 1
    assert request.spec_token_ids == [-1, -1, -1]
    out2 = scheduler.schedule()  # one placeholder token + 3 placeholder drafts
    assert out2.num_scheduled_tokens == {"0": 4}
    assert out2.scheduled_spec_decode_tokens == {"0": [-1, -1, -1]}
    assert request.num_computed_tokens == 14
    assert request.num_output_placeholders == 1 + 4

    scheduler.update_from_output(out1, runner_output(out1, [[7]]))
    assert request.num_output_placeholders == 4
    # One draft accepted, two rejected: 2 tokens in, 2 computed taken back.
    scheduler.update_from_output(out2, runner_output(out2, [[8, 9]]))
    assert request.num_output_placeholders == 0
    assert list(request.output_token_ids) == [7, 8, 9]
    assert request.num_computed_tokens == request.num_tokens - 1 == 12


def test_pipelined_steps_with_drafts():
    """Two steps in flight, random acceptance: every request gets exactly the
    runner's tokens, in order, and stops at max_tokens; the counters end
    consistent. The fake runner keeps its own view of each sequence (as a
    runner does: it knows how many drafts it accepted)."""
    max_tokens, num_spec = 20, 3
    scheduler = create_scheduler(
        async_scheduling=True, num_speculative_tokens=num_spec, max_model_len=1024
    )
    requests = create_requests(num_requests=4, num_tokens=5, max_tokens=max_tokens, ignore_eos=True)
    for request in requests:
        scheduler.add_request(request)
    rng = random.Random(0)
    view: dict[str, list[int]] = {}  # req_id -> [seq_len, computed], the runner's
    emitted: dict[str, list[int]] = {r.request_id: [] for r in requests}
    next_token = iter(range(1000, 100000))

    def run(out: SchedulerOutput) -> ModelRunnerOutput:
        for new in out.scheduled_new_reqs:
            view[new.req_id] = [len(new.prompt_token_ids), new.num_computed_tokens]
        sampled = []
        for req_id, n in out.num_scheduled_tokens.items():
            seq_len, computed = view[req_id]
            drafts = out.scheduled_spec_decode_tokens.get(req_id, [])
            assert drafts == [-1] * len(drafts)
            assert computed + n - len(drafts) == seq_len  # a decode step (or the prompt)
            num_accepted = rng.randint(0, len(drafts))
            tokens = [next(next_token) for _ in range(num_accepted + 1)]
            emitted[req_id] += tokens
            view[req_id] = [seq_len + num_accepted + 1, seq_len + num_accepted]
            sampled.append(tokens)
        return runner_output(out, sampled)

    in_flight: deque[SchedulerOutput] = deque()
    for _ in range(500):
        if scheduler.has_requests() and len(in_flight) < 2:
            out = scheduler.schedule()
            if out.num_scheduled_tokens:
                in_flight.append(out)
                if len(in_flight) < 2:
                    continue
        if not in_flight:
            break
        out = in_flight.popleft()
        scheduler.update_from_output(out, run(out))
        for request in scheduler.running:
            assert request.num_output_placeholders >= 0
            if not any(request.request_id in o.num_scheduled_tokens for o in in_flight):
                # Nothing in flight: the scheduler agrees with the runner.
                assert request.num_output_placeholders == 0
                assert request.num_computed_tokens == request.num_tokens - 1
                assert view[request.request_id][1] == request.num_computed_tokens
    assert not scheduler.has_requests()
    for request in requests:
        assert request.get_finished_reason() == FinishReason.LENGTH
        assert list(request.output_token_ids) == emitted[request.request_id][:max_tokens]
        # No step was scheduled once those in flight surely reached max_tokens.
        assert len(emitted[request.request_id]) < max_tokens + 2 * (num_spec + 1)


def test_reset_prefix_cache_discards_stale_drafted_steps():
    """A forced preemption with drafted steps in flight: their tokens (and
    rejected drafts) are discarded, then the request recomputes and carries
    on with fresh tokens only."""
    scheduler = create_scheduler(async_scheduling=True, num_speculative_tokens=2)
    request = make_request("0", num_tokens=6, max_tokens=30, ignore_eos=True)
    scheduler.add_request(request)
    out1 = scheduler.schedule()
    out2 = scheduler.schedule()
    assert out2.scheduled_spec_decode_tokens == {"0": [-1, -1]}
    scheduler.update_from_output(out1, runner_output(out1, [[7]]))
    assert scheduler.reset_prefix_cache(reset_running_requests=True)
    assert request.num_output_placeholders == 0
    out3 = scheduler.schedule()  # resumed: recomputes its 7 known tokens
    assert out3.num_scheduled_tokens == {"0": 7}
    # The stale step: 1 draft accepted, 1 rejected; all of it is dropped.
    scheduler.update_from_output(out2, runner_output(out2, [[8, 9]]))
    assert list(request.output_token_ids) == [7]
    assert "0" not in scheduler._num_async_tokens_to_discard
    scheduler.update_from_output(out3, runner_output(out3, [[10]]))
    assert list(request.output_token_ids) == [7, 10]
    assert request.num_output_placeholders == 0


def test_drafts_in_output_replace_placeholders():
    """update_draft_token_ids_in_output: each scheduled request's placeholders
    become the first n of the runner's drafts (n scheduled); requests the
    step does not verify drafts for, and finished ones, are left alone."""
    scheduler = create_scheduler(
        async_scheduling=True, num_speculative_tokens=3, max_num_batched_tokens=64
    )
    for req_id in ("1", "2"):
        scheduler.add_request(make_request(req_id, num_tokens=10, max_tokens=50))
    out1 = scheduler.schedule()  # both prompts
    out2 = scheduler.schedule()  # each: a placeholder token + 3 placeholder drafts
    assert out2.scheduled_spec_decode_tokens == {"1": [-1, -1, -1], "2": [-1, -1, -1]}
    out2.scheduled_spec_decode_tokens["2"] = [-1, -1]  # as if the budget cut one
    drafts = DraftTokenIds(["1", "2", "3"], [[5, 6, 7], [8, 9, 10], [11, 12, 13]])
    scheduler.update_draft_token_ids_in_output(drafts, out2)
    assert out2.scheduled_spec_decode_tokens == {"1": [5, 6, 7], "2": [8, 9]}
    assert out2.num_invalid_spec_tokens == {}
    assert scheduler.requests["1"].spec_token_ids == [-1, -1, -1]  # the shared placeholders
    scheduler.update_from_output(out1, runner_output(out1, [[1], [2]]))
    scheduler.finish_requests("1", RequestStatus.FINISHED_ABORTED)
    out2.scheduled_spec_decode_tokens["2"] = [-1, -1]
    scheduler.update_draft_token_ids_in_output(drafts, out2)
    assert out2.scheduled_spec_decode_tokens == {"1": [5, 6, 7], "2": [8, 9]}


def test_grammar_invalid_drafts_not_counted_as_drafted():
    """Drafts the grammar ruled out (num_invalid_spec_tokens) are rejected
    by the runner but, as upstream, not counted in the drafted stats."""
    scheduler = create_scheduler(async_scheduling=True, num_speculative_tokens=3, log_stats=True)
    request = make_request("0", num_tokens=10, max_tokens=50)
    scheduler.add_request(request)
    out1 = scheduler.schedule()
    out2 = scheduler.schedule()
    out2.scheduled_spec_decode_tokens["0"] = [4, -1, -1]
    out2.num_invalid_spec_tokens = {"0": 2}
    scheduler.update_from_output(out1, runner_output(out1, [[7]]))
    outputs = scheduler.update_from_output(out2, runner_output(out2, [[4, 5]]))
    stats = outputs[0].scheduler_stats.spec_decoding_stats
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, 1, 1)
    assert request.num_computed_tokens == request.num_tokens - 1  # 2 rejected taken back
