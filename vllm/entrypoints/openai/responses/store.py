"""The in-memory response store of `/v1/responses` (upstream keeps plain
dicts on OpenAIServingResponses: response_store, msg_store, background_tasks).

Enabled with VLLM_ENABLE_RESPONSES_API_STORE=1 (upstream's switch; off, a
request's `store` is ignored and nothing is kept). Bounded, unlike upstream's:
at most VLLM_RESPONSES_API_STORE_MAX_ENTRIES responses (default 1024); adding
one more evicts the oldest finished one. A queued or running background
response is never evicted (its task would write it back): the store may hold
more than the limit only while that many are still running. A streamed
background response keeps its events (GET with `stream=true` replays them
after `starting_after`).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from vllm.entrypoints.openai.responses.protocol import ResponsesResponse
from vllm.logger import init_logger

logger = init_logger(__name__)

ACTIVE_STATUSES = frozenset({"queued", "in_progress"})


@dataclass
class StoredResponse:
    response: ResponsesResponse
    # The conversation behind it (input and output as chat messages, without
    # the instructions): the history of a request that continues it.
    conversation: list[dict[str, Any]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    # A streamed background response: its SSE frames so far (frame i has
    # sequence_number i) and a signal for each new one.
    events: list[str] | None = None
    new_event: asyncio.Event | None = None

    async def replay(self, starting_after: int | None = None) -> AsyncGenerator[str, None]:
        """The stream's frames after `starting_after`, then live ones until
        its task ends (finished or cancelled)."""
        assert self.events is not None and self.new_event is not None
        index = 0 if starting_after is None else max(starting_after + 1, 0)
        while True:
            while index < len(self.events):
                yield self.events[index]
                index += 1
            if self.task is None:
                return
            self.new_event.clear()
            await self.new_event.wait()


class ResponseStore:
    """Responses by id, oldest first; bounded (see the module docstring)."""

    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError(
                f"VLLM_RESPONSES_API_STORE_MAX_ENTRIES must be at least 1, got {max_entries}"
            )
        self.max_entries = max_entries
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, response_id: str) -> StoredResponse | None:
        return self._entries.get(response_id)

    def put(self, entry: StoredResponse) -> None:
        """Add or replace (a replaced entry keeps its place in the order)."""
        self._entries[entry.response.id] = entry
        self._evict()

    def _evict(self) -> None:
        excess = len(self._entries) - self.max_entries
        if excess <= 0:
            return
        finished = [
            rid for rid, e in self._entries.items() if e.response.status not in ACTIVE_STATUSES
        ]
        for rid in finished[:excess]:
            del self._entries[rid]
        if len(self._entries) > self.max_entries:
            logger.warning(
                "The response store holds %d responses (limit %d): the rest are "
                "background responses still running.",
                len(self._entries),
                self.max_entries,
            )
