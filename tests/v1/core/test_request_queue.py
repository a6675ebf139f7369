"""The waiting queues: FCFS order, priority order, prepend and removal."""

import pytest

from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.request_queue import (
    FCFSRequestQueue,
    PriorityRequestQueue,
    SchedulingPolicy,
    create_request_queue,
)
from vllm.v1.request import Request

pytestmark = pytest.mark.cpu_test


def make_request(req_id: str, priority: int = 0, arrival_time: float = 0.0) -> Request:
    return Request(
        request_id=req_id,
        prompt_token_ids=[1, 2, 3],
        sampling_params=SamplingParams(max_tokens=4),
        priority=priority,
        arrival_time=arrival_time,
    )


def ids(queue) -> list[str]:
    return [req.request_id for req in queue]


def test_create_request_queue():
    assert isinstance(create_request_queue(SchedulingPolicy.FCFS), FCFSRequestQueue)
    assert isinstance(create_request_queue(SchedulingPolicy.PRIORITY), PriorityRequestQueue)
    assert SchedulingPolicy("priority") is SchedulingPolicy.PRIORITY
    with pytest.raises(ValueError):
        SchedulingPolicy("sjf")


def test_fcfs_order_and_prepend():
    queue = FCFSRequestQueue()
    assert not queue and len(queue) == 0
    a, b, c, d = (make_request(x) for x in "abcd")
    for req in (a, b, c):
        queue.add_request(req)
    assert queue and len(queue) == 3
    assert queue.peek_request() is a
    assert ids(queue) == ["a", "b", "c"]
    # A preempted request goes to the head.
    queue.prepend_request(d)
    assert queue.pop_request() is d
    assert queue.pop_request() is a
    assert ids(queue) == ["b", "c"]


def test_fcfs_prepend_requests_keeps_their_order():
    queue = FCFSRequestQueue()
    queue.add_request(make_request("x"))
    # The scheduler fills the skipped queue with prepend_request while it
    # walks the waiting queue from the head: a first, then b.
    skipped = FCFSRequestQueue()
    skipped.prepend_request(make_request("a"))
    skipped.prepend_request(make_request("b"))
    queue.prepend_requests(skipped)
    assert ids(queue) == ["a", "b", "x"]


def test_fcfs_remove():
    queue = FCFSRequestQueue()
    reqs = [make_request(str(i)) for i in range(5)]
    for req in reqs:
        queue.add_request(req)
    queue.remove_request(reqs[2])
    assert ids(queue) == ["0", "1", "3", "4"]
    # Requests that are not queued are ignored by remove_requests.
    queue.remove_requests([reqs[0], reqs[4], reqs[2]])
    assert ids(queue) == ["1", "3"]
    with pytest.raises(ValueError):
        queue.remove_request(reqs[0])


def test_empty_queues_raise():
    for queue in (FCFSRequestQueue(), PriorityRequestQueue()):
        with pytest.raises(IndexError):
            queue.peek_request()
        with pytest.raises(IndexError):
            queue.pop_request()


def test_priority_order():
    queue = PriorityRequestQueue()
    # (priority, arrival_time): lower priority value first, then earlier arrival.
    specs = {"late-high": (0, 5.0), "low": (3, 0.0), "early-high": (0, 1.0), "mid": (1, 0.5)}
    for req_id, (prio, arrival) in specs.items():
        queue.add_request(make_request(req_id, prio, arrival))
    assert len(queue) == 4
    # Iteration follows the pop order and does not consume the queue.
    assert ids(queue) == ["early-high", "late-high", "mid", "low"]
    assert len(queue) == 4
    assert queue.peek_request().request_id == "early-high"
    assert [queue.pop_request().request_id for _ in range(4)] == [
        "early-high",
        "late-high",
        "mid",
        "low",
    ]
    assert not queue


def test_priority_prepend_goes_to_priority_slot():
    queue = PriorityRequestQueue()
    queue.add_request(make_request("first", 0, 0.0))
    # "Prepending" a low-priority request does not put it at the head.
    queue.prepend_request(make_request("preempted", 5, 0.0))
    assert queue.peek_request().request_id == "first"
    other = PriorityRequestQueue()
    other.add_request(make_request("urgent", -1, 9.0))
    queue.prepend_requests(other)
    assert ids(queue) == ["urgent", "first", "preempted"]


def test_priority_remove():
    queue = PriorityRequestQueue()
    reqs = [make_request(str(i), priority=i) for i in range(5)]
    for req in reversed(reqs):
        queue.add_request(req)
    queue.remove_request(reqs[0])
    assert queue.peek_request() is reqs[1]
    queue.remove_requests({reqs[1], reqs[3]})
    assert ids(queue) == ["2", "4"]
