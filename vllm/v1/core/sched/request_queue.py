"""Waiting queues of the scheduler, one per scheduling policy.

The scheduler keeps requests that are not running (new ones and preempted
ones) in a `RequestQueue`. The queue decides which request is admitted next:

* `FCFSRequestQueue`: arrival order. Preempted requests are prepended, so
  they are the first to resume.
* `PriorityRequestQueue`: a min-heap on `Request.__lt__`, i.e. on
  `(priority, arrival_time, request_id)`; a smaller priority value runs first.
  "Prepending" has no meaning there: a request goes back to its heap position.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable, Iterator
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.v1.request import Request


class SchedulingPolicy(Enum):
    """Scheduling policies (`SchedulerConfig.policy`)."""

    FCFS = "fcfs"
    PRIORITY = "priority"


class RequestQueue(ABC):
    """The waiting queue interface the scheduler relies on."""

    @abstractmethod
    def add_request(self, request: Request) -> None:
        """Insert a request at the place the policy gives it."""

    @abstractmethod
    def pop_request(self) -> Request:
        """Remove and return the next request to schedule.

        Raises IndexError when the queue is empty."""

    @abstractmethod
    def peek_request(self) -> Request:
        """Return the next request to schedule without removing it.

        Raises IndexError when the queue is empty."""

    @abstractmethod
    def prepend_request(self, request: Request) -> None:
        """Put a request back at the front (FCFS) or at its policy position
        (priority). Used for preempted and skipped requests."""

    @abstractmethod
    def prepend_requests(self, requests: RequestQueue) -> None:
        """Put back every request of `requests`, which was filled with
        `prepend_request`, so that their relative order is restored."""

    @abstractmethod
    def remove_request(self, request: Request) -> None:
        """Remove one request; raises ValueError if it is not queued."""

    @abstractmethod
    def remove_requests(self, requests: Iterable[Request]) -> None:
        """Remove every queued request found in `requests`; others are
        ignored."""

    @abstractmethod
    def __bool__(self) -> bool:
        """True when at least one request is queued."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of queued requests."""

    @abstractmethod
    def __iter__(self) -> Iterator[Request]:
        """Iterate in scheduling order, without consuming the queue."""


class FCFSRequestQueue(deque["Request"], RequestQueue):
    """First-come-first-served queue: a deque with the RequestQueue API."""

    def add_request(self, request: Request) -> None:
        self.append(request)

    def pop_request(self) -> Request:
        return self.popleft()

    def peek_request(self) -> Request:
        if not self:
            raise IndexError("peek from an empty request queue")
        return self[0]

    def prepend_request(self, request: Request) -> None:
        self.appendleft(request)

    def prepend_requests(self, requests: RequestQueue) -> None:
        # `requests` was built with prepend_request, so it holds its requests
        # in reverse order; extendleft reverses them once more, which puts
        # them back in their original order at the head of this queue.
        self.extendleft(requests)

    def remove_request(self, request: Request) -> None:
        self.remove(request)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        to_remove = requests if isinstance(requests, set) else set(requests)
        kept = [req for req in self if req not in to_remove]
        # A deque cannot be filtered in place.
        self.clear()
        self.extend(kept)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __len__(self) -> int:
        return deque.__len__(self)

    def __iter__(self) -> Iterator[Request]:
        return deque.__iter__(self)


class PriorityRequestQueue(RequestQueue):
    """Min-heap on `(priority, arrival_time, request_id)` (`Request.__lt__`)."""

    def __init__(self) -> None:
        self._heap: list[Request] = []

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, request)

    def pop_request(self) -> Request:
        if not self._heap:
            raise IndexError("pop from an empty request queue")
        return heapq.heappop(self._heap)

    def peek_request(self) -> Request:
        if not self._heap:
            raise IndexError("peek from an empty request queue")
        return self._heap[0]

    def prepend_request(self, request: Request) -> None:
        # A heap has no front: the request goes back to its priority slot.
        self.add_request(request)

    def prepend_requests(self, requests: RequestQueue) -> None:
        for request in requests:
            self.add_request(request)

    def remove_request(self, request: Request) -> None:
        self._heap.remove(request)
        heapq.heapify(self._heap)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        to_remove = requests if isinstance(requests, set) else set(requests)
        self._heap = [req for req in self._heap if req not in to_remove]
        heapq.heapify(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        # Pop from a copy so that iteration follows the scheduling order.
        heap = list(self._heap)
        while heap:
            yield heapq.heappop(heap)


def create_request_queue(policy: SchedulingPolicy) -> RequestQueue:
    """Build the waiting queue for a scheduling policy."""
    if policy == SchedulingPolicy.PRIORITY:
        return PriorityRequestQueue()
    if policy == SchedulingPolicy.FCFS:
        return FCFSRequestQueue()
    raise ValueError(f"Unknown scheduling policy: {policy}")
