"""The scheduler on CPU over a fake one-layer KV cache: the token budget,
chunked prefill, preemption, resumption (V1 and V2 runner forms), stop
checks, aborts and prefix-cache hits. Block 0 is the null block, so the
first allocated block has id 1."""

import pytest

from tests.v1.core.scheduler_utils import (
    EOS_TOKEN_ID,
    create_requests,
    create_scheduler,
    make_model_runner_output,
    make_request,
)
from vllm.v1.core.sched.utils import check_stop
from vllm.v1.engine import FinishReason
from vllm.v1.metrics.stats import SchedulerStats
from vllm.v1.request import RequestStatus

pytestmark = pytest.mark.cpu_test


def step(scheduler, sampled=None, default_token=1):
    """schedule() + a model runner output + update_from_output()."""
    output = scheduler.schedule()
    runner_output = make_model_runner_output(scheduler, output, sampled, default_token)
    engine_outputs = scheduler.update_from_output(output, runner_output)
    return output, engine_outputs


def num_free_blocks(scheduler) -> int:
    return scheduler.kv_cache_manager.block_pool.get_num_free_blocks()


def block_ids(scheduler, req_id: str) -> list[int]:
    (ids,) = scheduler.kv_cache_manager.get_block_ids(req_id)
    return list(ids)


def outputs_by_id(engine_outputs) -> dict:
    return {o.request_id: o for eco in engine_outputs.values() for o in eco.outputs}


# ---------------------------------------------------------------------------
# Requests in and out of the queues
# ---------------------------------------------------------------------------


def test_add_and_finish_requests():
    scheduler = create_scheduler()
    requests = create_requests(num_requests=5)
    for i, request in enumerate(requests):
        scheduler.add_request(request)
        assert scheduler.requests[request.request_id] is request
        assert len(scheduler.waiting) == i + 1
    with pytest.raises(ValueError):
        scheduler.add_request(requests[0])
    assert scheduler.get_request_counts() == (0, 5)
    for i, request in enumerate(requests):
        finished = scheduler.finish_requests(request.request_id, RequestStatus.FINISHED_ABORTED)
        assert finished == [(request.request_id, 0)]
        assert request.status == RequestStatus.FINISHED_ABORTED
        assert request.request_id not in scheduler.requests
        assert scheduler.get_num_unfinished_requests() == 4 - i
    # Unknown and already finished ids are ignored.
    assert scheduler.finish_requests(["0", "nope"], RequestStatus.FINISHED_ABORTED) == []
    assert not scheduler.has_unfinished_requests()
    assert scheduler.has_finished_requests()
    assert scheduler.schedule().finished_req_ids == {"0", "1", "2", "3", "4"}
    assert not scheduler.has_requests()


def test_unknown_policy_is_rejected():
    scheduler = create_scheduler()
    scheduler.scheduler_config.policy = "sjf"
    with pytest.raises(ValueError, match="Unknown scheduling policy"):
        type(scheduler)(
            vllm_config=scheduler.vllm_config,
            kv_cache_config=scheduler.kv_cache_config,
            structured_output_manager=scheduler.structured_output_manager,
        )


# ---------------------------------------------------------------------------
# The token budget and chunked prefill
# ---------------------------------------------------------------------------


def test_schedule_all_requests():
    scheduler = create_scheduler()
    requests = create_requests(num_requests=10, num_tokens=20)
    for request in requests:
        scheduler.add_request(request)
    output = scheduler.schedule()
    assert [r.req_id for r in output.scheduled_new_reqs] == [str(i) for i in range(10)]
    assert output.scheduled_cached_reqs.num_reqs == 0
    assert output.num_scheduled_tokens == {str(i): 20 for i in range(10)}
    assert output.total_num_scheduled_tokens == 200
    assert output.finished_req_ids == set() and output.preempted_req_ids == set()
    # 20 tokens take two 16-token blocks each, allocated in order from id 1.
    for i, new_req in enumerate(output.scheduled_new_reqs):
        assert new_req.block_ids == ([2 * i + 1, 2 * i + 2],)
        assert new_req.num_computed_tokens == 0
        assert new_req.prompt_token_ids == [i] * 20
    assert len(scheduler.waiting) == 0
    assert scheduler.running == requests
    assert all(r.num_computed_tokens == 20 for r in requests)


def test_chunked_prefill_across_steps():
    scheduler = create_scheduler(max_num_batched_tokens=64, max_model_len=1024)
    for req_id, num_tokens in (("0", 100), ("1", 30), ("2", 10)):
        scheduler.add_request(make_request(req_id, num_tokens))

    out, _ = step(scheduler)
    assert out.num_scheduled_tokens == {"0": 64}
    assert [r.req_id for r in out.scheduled_new_reqs] == ["0"]
    assert len(scheduler.waiting) == 2

    # Request 0 finishes its prompt (36) and request 1 gets the rest (28 of 30).
    out, engine_outputs = step(scheduler)
    assert out.num_scheduled_tokens == {"0": 36, "1": 28}
    assert out.scheduled_cached_reqs.req_ids == ["0"]
    assert out.scheduled_cached_reqs.num_computed_tokens == [64]
    assert [r.req_id for r in out.scheduled_new_reqs] == ["1"]
    # Only the request that finished its prompt sampled a token.
    assert {o.request_id: o.new_token_ids for o in outputs_by_id(engine_outputs).values()} == {
        "0": [1]
    }

    out, _ = step(scheduler)
    assert out.num_scheduled_tokens == {"0": 1, "1": 2, "2": 10}
    assert out.scheduled_cached_reqs.req_ids == ["0", "1"]
    assert out.scheduled_cached_reqs.num_computed_tokens == [100, 28]
    assert out.scheduled_cached_reqs.num_output_tokens == [1, 0]


def test_long_prefill_token_threshold():
    # The prompts are exactly max_model_len (100) tokens long: the last chunk
    # still reaches position 99, and each request then samples one token.
    scheduler = create_scheduler(max_num_batched_tokens=100, long_prefill_token_threshold=40)
    for request in create_requests(num_requests=3, num_tokens=100):
        scheduler.add_request(request)
    expected_steps = [
        {"0": 40, "1": 40, "2": 20},
        {"0": 40, "1": 40, "2": 20},
        {"0": 20, "1": 20, "2": 40},
        {"2": 20},
    ]
    for expected in expected_steps:
        out, engine_outputs = step(scheduler)
        assert out.num_scheduled_tokens == expected
    # 101 tokens do not fit the 100-token context.
    assert all(
        o.finish_reason == FinishReason.LENGTH for o in outputs_by_id(engine_outputs).values()
    )
    assert not scheduler.has_unfinished_requests()


def test_max_num_seqs():
    scheduler = create_scheduler(max_num_seqs=2)
    scheduler.add_request(make_request("0", max_tokens=1))
    scheduler.add_request(make_request("1", max_tokens=5))
    scheduler.add_request(make_request("2", max_tokens=5))
    out, _ = step(scheduler)
    assert set(out.num_scheduled_tokens) == {"0", "1"}
    assert [r.request_id for r in scheduler.waiting] == ["2"]
    # Request 0 finished after one token, which makes room for request 2.
    out, _ = step(scheduler)
    assert out.num_scheduled_tokens == {"1": 1, "2": 10}
    assert out.finished_req_ids == {"0"}


def test_chunked_prefill_disabled_stops_at_a_prompt_that_does_not_fit():
    scheduler = create_scheduler(
        max_num_batched_tokens=64, max_model_len=64, enable_chunked_prefill=False
    )
    for req_id in ("0", "1", "2"):
        scheduler.add_request(make_request(req_id, 40 if req_id != "2" else 4))
    out, _ = step(scheduler)
    # Request 1 (40 tokens) does not fit in the 24 left; request 2 would, but
    # the queue order is kept.
    assert out.num_scheduled_tokens == {"0": 40}
    assert [r.request_id for r in scheduler.waiting] == ["1", "2"]
    out, _ = step(scheduler)
    assert out.num_scheduled_tokens == {"0": 1, "1": 40, "2": 4}


# ---------------------------------------------------------------------------
# Preemption and resumption
# ---------------------------------------------------------------------------


def _fill_cache_then_preempt(scheduler):
    """Two 32-token requests fill all 4 usable blocks; request 0's first
    decode step needs a 3rd block, so request 1 (the last running) is
    preempted. Request 0 stops after 3 tokens, which lets request 1 resume."""
    scheduler.add_request(make_request("0", 32, max_tokens=3))
    scheduler.add_request(make_request("1", 32, max_tokens=10))
    out, _ = step(scheduler, sampled={"1": [99]})
    assert [r.block_ids for r in out.scheduled_new_reqs] == [([1, 2],), ([3, 4],)]
    assert num_free_blocks(scheduler) == 0

    out, _ = step(scheduler)
    req1 = scheduler.requests["1"]
    assert out.preempted_req_ids == {"1"}
    assert out.num_scheduled_tokens == {"0": 1}
    assert req1.status == RequestStatus.PREEMPTED
    assert req1.num_computed_tokens == 0 and req1.num_preemptions == 1
    assert scheduler.waiting.peek_request() is req1
    assert block_ids(scheduler, "1") == []
    # Request 1's blocks were freed last block first: 4 went to request 0.
    assert out.scheduled_cached_reqs.new_block_ids == [([4],)]
    assert block_ids(scheduler, "0") == [1, 2, 4]
    assert num_free_blocks(scheduler) == 1

    # Request 1 needs 3 blocks for its 33 tokens; only one is free. Nothing is
    # preempted in this step, yet the waiting request cannot be admitted.
    out, engine_outputs = step(scheduler)
    assert out.num_scheduled_tokens == {"0": 1}
    assert out.preempted_req_ids == set()
    assert outputs_by_id(engine_outputs)["0"].finish_reason == FinishReason.LENGTH
    assert num_free_blocks(scheduler) == 4
    return req1


def test_preemption_and_resume_v1_runner():
    scheduler = create_scheduler(num_blocks=5)
    scheduler.use_v2_model_runner = False
    req1 = _fill_cache_then_preempt(scheduler)

    out = scheduler.schedule()
    assert out.finished_req_ids == {"0"}
    assert out.num_scheduled_tokens == {"1": 33}
    assert out.scheduled_new_reqs == []
    cached = out.scheduled_cached_reqs
    assert cached.req_ids == ["1"]
    assert cached.resumed_req_ids == {"1"}
    # The worker replaces the block list of a resumed request with this one.
    assert cached.new_block_ids == [tuple([block_ids(scheduler, "1")])]
    assert len(block_ids(scheduler, "1")) == 3
    assert cached.all_token_ids == {"1": [1] * 32 + [99]}
    assert cached.num_computed_tokens == [0]
    assert cached.num_output_tokens == [1]
    assert req1.status == RequestStatus.RUNNING and req1.num_computed_tokens == 33


def test_preemption_and_resume_v2_runner():
    scheduler = create_scheduler(num_blocks=5)
    scheduler.use_v2_model_runner = True
    req1 = _fill_cache_then_preempt(scheduler)

    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"1": 33}
    # V2 gets the resumed request as a new one, with every token to prefill.
    assert out.scheduled_cached_reqs.num_reqs == 0
    (new_req,) = out.scheduled_new_reqs
    assert new_req.req_id == "1"
    assert new_req.prefill_token_ids == [1] * 32 + [99]
    assert new_req.prompt_token_ids == [1] * 32
    assert new_req.num_computed_tokens == 0
    assert new_req.block_ids == (block_ids(scheduler, "1"),)
    assert req1.status == RequestStatus.RUNNING


def test_v2_new_requests_carry_prefill_token_ids():
    scheduler = create_scheduler()
    scheduler.use_v2_model_runner = True
    scheduler.add_request(make_request("3", 5))
    (new_req,) = scheduler.schedule().scheduled_new_reqs
    assert new_req.prefill_token_ids == [3] * 5


@pytest.mark.parametrize("use_v2", [False, True])
def test_all_token_ids_for_running_request_skipped_last_step(use_v2: bool):
    scheduler = create_scheduler()
    scheduler.use_v2_model_runner = use_v2
    for request in create_requests(num_requests=2, num_tokens=8):
        scheduler.add_request(request)
    step(scheduler)
    # A one-token budget schedules only request 0.
    scheduler.max_num_scheduled_tokens = 1
    out, _ = step(scheduler)
    assert out.num_scheduled_tokens == {"0": 1}
    scheduler.max_num_scheduled_tokens = 8192
    out = scheduler.schedule()
    cached = out.scheduled_cached_reqs
    assert cached.req_ids == ["0", "1"]
    assert cached.resumed_req_ids == set()
    # The V1 runner dropped request 1 from its batch: it needs all tokens.
    assert cached.all_token_ids == ({} if use_v2 else {"1": [1] * 8 + [1]})
    assert cached.new_block_ids == [None, None]


def test_priority_preemption_takes_back_a_scheduled_request():
    # 5 usable blocks. "low" (priority 1) runs first; then "high" (32 tokens,
    # 2 full blocks) and "mid" join. When "high" needs a 3rd block, "low" is
    # the victim although it was already scheduled in this step.
    scheduler = create_scheduler(num_blocks=6, policy="priority")
    scheduler.add_request(make_request("1", 20, priority=1, arrival_time=0.0))
    step(scheduler)
    scheduler.add_request(make_request("2", 32, priority=0, arrival_time=1.0))
    scheduler.add_request(make_request("3", 5, priority=0, arrival_time=2.0))
    out, _ = step(scheduler)
    assert out.num_scheduled_tokens == {"1": 1, "2": 32, "3": 5}
    assert num_free_blocks(scheduler) == 0
    assert [r.request_id for r in scheduler.running] == ["1", "2", "3"]

    out, _ = step(scheduler)
    low = scheduler.requests["1"]
    assert out.preempted_req_ids == {"1"}
    # The victim's token is given back to the budget and dropped from the
    # output; the request after "high" is still scheduled.
    assert out.num_scheduled_tokens == {"2": 1, "3": 1}
    assert out.total_num_scheduled_tokens == 2
    assert out.scheduled_cached_reqs.req_ids == ["2", "3"]
    # "low" freed blocks [1, 2] last block first, so "high" gets block 2.
    assert out.scheduled_cached_reqs.new_block_ids == [([2],), None]
    assert low.status == RequestStatus.PREEMPTED and low.num_computed_tokens == 0
    assert [r.request_id for r in scheduler.running] == ["2", "3"]
    assert list(scheduler.waiting) == [low]


def test_priority_preemption_victim_is_lowest_priority_latest_arrival():
    scheduler = create_scheduler(num_blocks=4, policy="priority")
    # Same priority: the later arrival is the victim, wherever it runs.
    scheduler.add_request(make_request("1", 16, priority=0, arrival_time=5.0))
    scheduler.add_request(make_request("2", 16, priority=0, arrival_time=1.0))
    scheduler.add_request(make_request("3", 16, priority=0, arrival_time=3.0))
    out, _ = step(scheduler)
    # The priority queue admitted them by arrival time.
    assert [r.req_id for r in out.scheduled_new_reqs] == ["2", "3", "1"]
    out, _ = step(scheduler)
    # "2" needs a new block: "1" (arrival 5.0) is preempted and "2" takes its
    # block. "3" then needs one too and is itself the latest arrival left.
    assert out.preempted_req_ids == {"1", "3"}
    assert out.num_scheduled_tokens == {"2": 1}
    assert block_ids(scheduler, "2") == [1, 3]
    assert [r.request_id for r in scheduler.waiting] == ["3", "1"]


# ---------------------------------------------------------------------------
# Stop conditions
# ---------------------------------------------------------------------------


def _run_one(request, tokens, **scheduler_kwargs):
    """Feed `tokens` to `request` one step at a time until it stops;
    returns the EngineCoreOutputs of each step for that request."""
    scheduler = create_scheduler(**scheduler_kwargs)
    scheduler.add_request(request)
    outs = []
    for token in tokens:
        _, engine_outputs = step(scheduler, sampled={request.request_id: [token]})
        outs.append(outputs_by_id(engine_outputs)[request.request_id])
        if request.is_finished():
            break
    return scheduler, outs


def test_stop_on_eos():
    request = make_request("0", max_tokens=10)
    scheduler, outs = _run_one(request, [5, 6, EOS_TOKEN_ID, 7])
    assert [o.new_token_ids for o in outs] == [[5], [6], [EOS_TOKEN_ID]]
    assert outs[-1].finish_reason == FinishReason.STOP and outs[-1].stop_reason is None
    assert request.status == RequestStatus.FINISHED_STOPPED
    assert "0" not in scheduler.requests and not scheduler.running
    assert num_free_blocks(scheduler) == 10000 - 1


def test_ignore_eos():
    request = make_request("0", max_tokens=3, ignore_eos=True)
    _, outs = _run_one(request, [EOS_TOKEN_ID] * 5)
    assert len(outs) == 3
    assert outs[-1].finish_reason == FinishReason.LENGTH
    assert list(request.output_token_ids) == [EOS_TOKEN_ID] * 3


def test_stop_token_ids_set_stop_reason():
    request = make_request("0", max_tokens=10, stop_token_ids=[42, 43])
    _, outs = _run_one(request, [5, 43, 6])
    assert outs[-1].new_token_ids == [43]
    assert outs[-1].finish_reason == FinishReason.STOP
    assert outs[-1].stop_reason == 43 == request.stop_reason


def test_max_tokens_and_max_model_len():
    request = make_request("0", max_tokens=4)
    _, outs = _run_one(request, [5] * 10)
    assert len(outs) == 4 and request.status == RequestStatus.FINISHED_LENGTH_CAPPED
    # A 10-token prompt in a 13-token context: 3 tokens, whatever max_tokens.
    request = make_request("0", max_tokens=100)
    _, outs = _run_one(request, [5] * 10, max_model_len=13, max_num_batched_tokens=64)
    assert request.num_tokens == 13 and len(outs) == 3
    assert outs[-1].finish_reason == FinishReason.LENGTH


def test_min_tokens_suppresses_stops():
    request = make_request("0", max_tokens=10, min_tokens=3, stop_token_ids=[42])
    _, outs = _run_one(request, [EOS_TOKEN_ID, 42, EOS_TOKEN_ID, 8])
    assert [o.new_token_ids for o in outs] == [[EOS_TOKEN_ID], [42], [EOS_TOKEN_ID]]
    assert request.status == RequestStatus.FINISHED_STOPPED and request.stop_reason is None


def test_check_stop_trims_tokens_after_the_stop():
    scheduler = create_scheduler()
    request = make_request("0", max_tokens=10, stop_token_ids=[42])
    scheduler.add_request(request)
    out = scheduler.schedule()
    # Several tokens in one step (speculative decoding): the stop ends it.
    runner_output = make_model_runner_output(scheduler, out, {"0": [3, 42, 4, 5]})
    o = outputs_by_id(scheduler.update_from_output(out, runner_output))["0"]
    assert o.new_token_ids == [3, 42]
    assert list(request.output_token_ids) == [3, 42]


def test_check_stop_unit():
    request = make_request("0", num_tokens=4, max_tokens=5, min_tokens=2)
    request.append_output_token_ids(EOS_TOKEN_ID)
    assert not check_stop(request, max_model_len=100)
    request.append_output_token_ids(EOS_TOKEN_ID)
    assert check_stop(request, max_model_len=100)
    assert request.status == RequestStatus.FINISHED_STOPPED
    # Even below min_tokens, a request cannot outgrow the context window.
    request = make_request("0", num_tokens=4, max_tokens=5, min_tokens=5)
    request.append_output_token_ids(7)
    assert check_stop(request, max_model_len=5)
    assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED


# ---------------------------------------------------------------------------
# Aborts and outputs
# ---------------------------------------------------------------------------


def test_abort_frees_blocks_and_tells_the_workers():
    scheduler = create_scheduler(num_blocks=11)
    for request in create_requests(num_requests=3, num_tokens=40):
        scheduler.add_request(request)
    step(scheduler)
    assert num_free_blocks(scheduler) == 10 - 9
    aborted = scheduler.finish_requests(["1", "2"], RequestStatus.FINISHED_ABORTED)
    assert sorted(aborted) == [("1", 0), ("2", 0)]
    assert num_free_blocks(scheduler) == 10 - 3
    assert [r.request_id for r in scheduler.running] == ["0"]
    out = scheduler.schedule()
    assert out.finished_req_ids == {"1", "2"}
    assert out.num_scheduled_tokens == {"0": 1}
    # finished_req_ids is reported once.
    assert scheduler.schedule().finished_req_ids == set()


def test_request_aborted_while_running_is_skipped():
    scheduler = create_scheduler()
    for request in create_requests(num_requests=2):
        scheduler.add_request(request)
    out = scheduler.schedule()
    runner_output = make_model_runner_output(scheduler, out)
    scheduler.finish_requests("0", RequestStatus.FINISHED_ABORTED)
    engine_outputs = scheduler.update_from_output(out, runner_output)
    assert list(outputs_by_id(engine_outputs)) == ["1"]
    assert scheduler.requests["1"].num_output_tokens == 1


def test_outputs_grouped_by_client_with_finished_set_and_stats():
    scheduler = create_scheduler(include_finished_set=True, log_stats=True)
    scheduler.add_request(make_request("0", max_tokens=1, client_index=0))
    scheduler.add_request(make_request("1", max_tokens=5, client_index=1))
    scheduler.add_request(make_request("2", max_tokens=5, client_index=1))
    _, engine_outputs = step(scheduler)
    assert set(engine_outputs) == {0, 1}
    assert [o.request_id for o in engine_outputs[1].outputs] == ["1", "2"]
    assert engine_outputs[0].finished_requests == {"0"}
    assert engine_outputs[1].finished_requests is None
    stats = [
        eco.scheduler_stats for eco in engine_outputs.values() if eco.scheduler_stats is not None
    ]
    assert len(stats) == 1 and isinstance(stats[0], SchedulerStats)
    assert stats[0].num_running_reqs == 2 and stats[0].num_waiting_reqs == 0
    assert 0.0 < stats[0].kv_cache_usage < 1.0
    # Events: QUEUED and SCHEDULED were recorded for the first output.
    assert len(outputs_by_id(engine_outputs)["1"].events) == 2
    # Client 1 aborts one of its requests: its finished set arrives alone.
    scheduler.finish_requests("2", RequestStatus.FINISHED_ABORTED)
    out = scheduler.schedule()
    runner_output = make_model_runner_output(scheduler, out)
    engine_outputs = scheduler.update_from_output(out, runner_output)
    assert engine_outputs[1].finished_requests == {"2"}


def test_no_stats_without_log_stats():
    scheduler = create_scheduler()
    assert scheduler.make_stats() is None
    scheduler.add_request(make_request("0"))
    _, engine_outputs = step(scheduler)
    assert all(eco.scheduler_stats is None for eco in engine_outputs.values())


# ---------------------------------------------------------------------------
# Prefix caching
# ---------------------------------------------------------------------------


def test_prefix_cache_hit_across_requests():
    scheduler = create_scheduler(enable_prefix_caching=True)
    prompt = list(range(40))  # 2 full blocks + 8 tokens
    scheduler.add_request(make_request("0", prompt=prompt))
    out, engine_outputs = step(scheduler)
    assert out.num_scheduled_tokens == {"0": 40}
    assert outputs_by_id(engine_outputs)["0"].num_cached_tokens == 0

    scheduler.add_request(make_request("1", prompt=prompt[:36] + [7, 7, 7]))
    out, engine_outputs = step(scheduler)
    (new_req,) = out.scheduled_new_reqs
    # The two full blocks are shared; only the last 7 tokens are computed.
    assert new_req.num_computed_tokens == 32
    assert out.num_scheduled_tokens == {"0": 1, "1": 7}
    assert new_req.block_ids[0][:2] == block_ids(scheduler, "0")[:2]
    assert scheduler.requests["1"].num_cached_tokens == 32
    assert outputs_by_id(engine_outputs)["1"].num_cached_tokens == 32


def test_prefix_cache_hit_within_one_step():
    scheduler = create_scheduler(enable_prefix_caching=True)
    for request in create_requests(num_requests=3, num_tokens=50, same_prompt=True):
        scheduler.add_request(request)
    out = scheduler.schedule()
    # The first request's full blocks are cached as soon as they are
    # allocated, so the later ones only compute the last partial block.
    assert out.num_scheduled_tokens == {"0": 50, "1": 2, "2": 2}


def test_prompt_logprobs_skip_the_prefix_cache():
    scheduler = create_scheduler(enable_prefix_caching=True)
    scheduler.add_request(make_request("0", 40))
    step(scheduler)
    scheduler.add_request(make_request("1", prompt=[0] * 40, prompt_logprobs=1))
    scheduler.add_request(make_request("2", prompt=[0] * 40))
    out = scheduler.schedule()
    assert out.num_scheduled_tokens["1"] == 40
    assert out.num_scheduled_tokens["2"] == 8


def test_reset_prefix_cache():
    scheduler = create_scheduler(enable_prefix_caching=True, num_blocks=10)
    scheduler.add_request(make_request("0", 40, max_tokens=20))
    step(scheduler)
    # Blocks are in use: a plain reset refuses.
    assert not scheduler.reset_prefix_cache()
    assert scheduler.reset_prefix_cache(reset_running_requests=True)
    request = scheduler.requests["0"]
    assert request.status == RequestStatus.PREEMPTED and not scheduler.running
    assert num_free_blocks(scheduler) == 9
    # Nothing is cached any more: the request recomputes all 41 tokens.
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"0": 41}
