"""The async scheduler: steps are scheduled while the previous one still runs,
so each decoding request carries output placeholders for its tokens in
flight."""

from collections import deque

import pytest

from tests.v1.core.scheduler_utils import (
    create_requests,
    create_scheduler,
    make_model_runner_output,
    make_request,
)
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.engine import FinishReason
from vllm.v1.engine.core import get_scheduler_cls
from vllm.v1.request import RequestStatus

pytestmark = pytest.mark.cpu_test


def schedule(scheduler, sampled=None, default_token=1):
    """schedule() and the runner output the step will produce."""
    out = scheduler.schedule()
    return out, make_model_runner_output(scheduler, out, sampled, default_token)


def run_pipelined(scheduler, before_update=None) -> int:
    """Drive the scheduler like the engine core's batch queue of two: step
    N + 1 is scheduled before step N's output is applied. Returns the total
    number of scheduled tokens."""
    in_flight = deque([schedule(scheduler), schedule(scheduler)])
    total = 0
    while in_flight:
        out, runner_output = in_flight.popleft()
        total += out.total_num_scheduled_tokens
        if before_update is not None:
            before_update()
        scheduler.update_from_output(out, runner_output)
        out, runner_output = schedule(scheduler)
        if out.num_scheduled_tokens:
            in_flight.append((out, runner_output))
    return total


def test_scheduler_class_follows_the_config():
    scheduler = create_scheduler(async_scheduling=True)
    assert isinstance(scheduler, AsyncScheduler)
    assert get_scheduler_cls(scheduler.scheduler_config) is AsyncScheduler


def test_placeholders_track_tokens_in_flight():
    scheduler = create_scheduler(
        async_scheduling=True, max_num_batched_tokens=64, max_model_len=1024
    )
    request = make_request("0", 100, max_tokens=10)
    scheduler.add_request(request)
    # A mid-prompt chunk samples nothing: no placeholder.
    out1, mro1 = schedule(scheduler)
    assert out1.num_scheduled_tokens == {"0": 64}
    assert request.num_output_placeholders == 0
    # The last chunk samples the first token.
    out2, mro2 = schedule(scheduler)
    assert out2.num_scheduled_tokens == {"0": 36}
    assert request.num_output_placeholders == 1
    # Scheduled again before that token is known: one decode step on the
    # placeholder.
    out3, mro3 = schedule(scheduler, sampled={"0": [7]})
    assert out3.num_scheduled_tokens == {"0": 1}
    assert request.num_output_placeholders == 2
    assert request.num_computed_tokens == 101 and request.num_tokens == 100
    assert out3.scheduled_cached_reqs.num_output_tokens == [1]

    scheduler.update_from_output(out1, mro1)
    assert request.num_output_placeholders == 2
    scheduler.update_from_output(out2, mro2)
    assert request.num_output_placeholders == 1
    assert list(request.output_token_ids) == [1]
    engine_outputs = scheduler.update_from_output(out3, mro3)
    assert request.num_output_placeholders == 0
    assert engine_outputs[0].outputs[0].new_token_ids == [7]
    assert list(request.output_token_ids) == [1, 7]


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5])
def test_stop_by_max_tokens_without_extra_steps(max_tokens: int):
    scheduler = create_scheduler(async_scheduling=True)
    requests = create_requests(num_requests=2, num_tokens=10, max_tokens=max_tokens)
    for request in requests:
        scheduler.add_request(request)
    total = run_pipelined(scheduler)
    assert not scheduler.has_unfinished_requests()
    for request in requests:
        assert request.num_output_tokens == max_tokens
        assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED
        assert request.num_output_placeholders == 0
    # The prompt, then one step per token except the last: no wasted step.
    assert total == 2 * (10 + max_tokens - 1)


def test_stop_at_max_model_len_without_extra_steps():
    scheduler = create_scheduler(async_scheduling=True, max_model_len=13, max_num_batched_tokens=64)
    request = make_request("0", 10, max_tokens=100)
    scheduler.add_request(request)
    total = run_pipelined(scheduler)
    assert request.num_tokens == 13
    assert request.get_finished_reason() == FinishReason.LENGTH
    # Positions 0..11: the token of position 11 fills the context.
    assert total == 12


def test_stop_token_while_a_step_is_in_flight():
    scheduler = create_scheduler(async_scheduling=True)
    request = make_request("0", 10, max_tokens=10, stop_token_ids=[42])
    scheduler.add_request(request)
    out1, mro1 = schedule(scheduler, sampled={"0": [42]})
    out2, mro2 = schedule(scheduler)
    scheduler.update_from_output(out1, mro1)
    assert request.status == RequestStatus.FINISHED_STOPPED
    assert scheduler.get_num_unfinished_requests() == 0
    # The step in flight for the finished request is dropped.
    assert scheduler.update_from_output(out2, mro2) == {}
    assert list(request.output_token_ids) == [42]
    assert scheduler.schedule().finished_req_ids == {"0"}


def test_abort_while_steps_are_in_flight():
    scheduler = create_scheduler(async_scheduling=True)
    requests = create_requests(num_requests=6, max_tokens=20)
    for request in requests:
        scheduler.add_request(request)
    abort_order = [0, 4, 2, 1, 5, 3]

    def abort_next():
        if abort_order:
            request = requests[abort_order.pop(0)]
            scheduler.finish_requests(request.request_id, RequestStatus.FINISHED_ABORTED)

    run_pipelined(scheduler, before_update=abort_next)
    for i, request in enumerate(requests):
        assert request.status == RequestStatus.FINISHED_ABORTED
        # Aborted before the output of its first step was applied, then one
        # token per step.
        assert request.num_output_tokens == [0, 4, 2, 1, 5, 3].index(i)
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 10000 - 1


def test_blocks_completed_by_late_tokens_are_cached():
    block_size = 16
    scheduler = create_scheduler(
        async_scheduling=True, enable_prefix_caching=True, block_size=block_size
    )
    prompt = list(range(100, 115))  # 15 tokens: the first sampled token fills block 0
    scheduler.add_request(make_request("0", prompt=prompt, max_tokens=2))
    run_pipelined(scheduler)
    assert not scheduler.has_unfinished_requests()
    # Only after the outputs came back were the 16 tokens of block 0 known;
    # the async scheduler caches the block then, so a follow-up hits it.
    follow_up = make_request("1", prompt=prompt + [1] + [7] * 5)
    scheduler.add_request(follow_up)
    out = scheduler.schedule()
    assert out.scheduled_new_reqs[0].num_computed_tokens == block_size
    assert out.num_scheduled_tokens == {"1": 5}


def test_prefix_hits_for_requests_added_while_steps_run():
    scheduler = create_scheduler(
        async_scheduling=True, enable_prefix_caching=True, max_num_batched_tokens=1000
    )
    requests = create_requests(num_requests=4, num_tokens=100, max_tokens=3, same_prompt=True)
    scheduler.add_request(requests[0])
    scheduler.add_request(requests[1])
    first, mro = schedule(scheduler)
    # Same prompt in the same step: all full blocks (96 tokens) are shared.
    assert first.num_scheduled_tokens == {"0": 100, "1": 4}
    pending = deque([(first, mro), schedule(scheduler)])
    added = iter(requests[2:])
    while pending:
        out, mro = pending.popleft()
        new_request = next(added, None)
        if new_request is not None:
            scheduler.add_request(new_request)
        scheduler.update_from_output(out, mro)
        out, mro = schedule(scheduler)
        if new_request is not None:
            assert out.num_scheduled_tokens[new_request.request_id] == 4
        if out.num_scheduled_tokens:
            pending.append((out, mro))
    assert not scheduler.has_unfinished_requests()


def test_reset_prefix_cache_discards_the_stale_token():
    scheduler = create_scheduler(async_scheduling=True, enable_prefix_caching=True)
    request = make_request("0", 10, max_tokens=5)
    scheduler.add_request(request)
    stale_out, stale_mro = schedule(scheduler, sampled={"0": [66]})
    assert request.num_output_placeholders == 1
    # A weight update while the step runs: the request restarts from its
    # known tokens, and the token of the running step must not be used.
    assert scheduler.reset_prefix_cache(reset_running_requests=True)
    assert request.status == RequestStatus.PREEMPTED
    assert request.num_output_placeholders == 0
    out, mro = schedule(scheduler, sampled={"0": [77]})
    assert out.num_scheduled_tokens == {"0": 10}
    assert request.num_output_placeholders == 1
    assert scheduler.update_from_output(stale_out, stale_mro) == {}
    assert request.num_output_tokens == 0 and request.num_output_placeholders == 1
    engine_outputs = scheduler.update_from_output(out, mro)
    assert engine_outputs[0].outputs[0].new_token_ids == [77]
    assert list(request.output_token_ids) == [77]
    assert request.num_output_placeholders == 0
