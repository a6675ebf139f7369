"""Statistics the engine core reports alongside its outputs."""

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from vllm.v1.spec_decode.metrics import SpecDecodingStats


@dataclass
class BaseCacheStats:
    """Hit counters of a cache, accumulated between two reports."""

    # Whether the cache was reset since the last report.
    reset: bool = False
    # Number of requests that looked the cache up.
    requests: int = 0
    # Number of tokens those requests asked for.
    queries: int = 0
    # Number of those tokens found in the cache.
    hits: int = 0

    def record(self, num_tokens: int, num_hits: int) -> None:
        """Count one lookup of ``num_tokens`` tokens that hit ``num_hits``."""
        self.requests += 1
        self.queries += num_tokens
        self.hits += num_hits


@dataclass
class PrefixCacheStats(BaseCacheStats):
    """Prefix-cache hit counters.

    Lookups by preempted requests (which mostly hit their own, just-freed
    blocks) are counted apart so that they do not inflate the hit rate.
    """

    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool = False) -> None:
        """Count one lookup; ``preempted`` routes it to the preempted counters."""
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            super().record(num_tokens, num_hits)


class CachingMetrics:
    """Hit rate of a cache over (about) the most recent `max_recent_requests`
    requests: a window of per-report (requests, queries, hits) triples, the
    oldest dropped while the window holds more requests than the limit (the
    newest report always stays)."""

    def __init__(self, max_recent_requests: int = 1000) -> None:
        self.max_recent_requests = max_recent_requests
        self.aggregated_requests = 0
        self.aggregated_query_total = 0
        self.aggregated_query_hit = 0
        self.query_queue: deque[tuple[int, int, int]] = deque()

    def observe(self, stats: BaseCacheStats) -> None:
        if stats.reset:  # the cache was reset before these lookups
            self.reset()
        if stats.requests == 0:  # an empty report would only push out real ones
            return
        self.query_queue.append((stats.requests, stats.queries, stats.hits))
        self.aggregated_requests += stats.requests
        self.aggregated_query_total += stats.queries
        self.aggregated_query_hit += stats.hits
        while len(self.query_queue) > 1 and self.aggregated_requests > self.max_recent_requests:
            requests, queries, hits = self.query_queue.popleft()
            self.aggregated_requests -= requests
            self.aggregated_query_total -= queries
            self.aggregated_query_hit -= hits

    def reset(self) -> None:
        self.aggregated_requests = 0
        self.aggregated_query_total = 0
        self.aggregated_query_hit = 0
        self.query_queue.clear()

    @property
    def empty(self) -> bool:
        return self.aggregated_requests == 0

    @property
    def hit_rate(self) -> float:
        if self.aggregated_query_total == 0:
            return 0.0
        return self.aggregated_query_hit / self.aggregated_query_total


@dataclass
class SchedulerStats:
    """Stats associated with the scheduler, sent with each EngineCoreOutputs."""

    num_running_reqs: int = 0
    # Length of the "waiting" request queue.
    num_waiting_reqs: int = 0

    # Used for data-parallel load balancing.
    step_counter: int = 0
    current_wave: int = 0

    # Fraction of KV cache blocks in use (0.0 - 1.0).
    kv_cache_usage: float = 0.0

    prefix_cache_stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)

    # The drafts verified in this step (speculative decoding), else None.
    spec_decoding_stats: SpecDecodingStats | None = None

    def __post_init__(self) -> None:
        # From an engine core process the stats arrive as plain dicts
        # (core_client_mp._restore_stats rebuilds only this dataclass).
        self.spec_decoding_stats = SpecDecodingStats.from_wire(self.spec_decoding_stats)


# ----------------------------------------------------------------------
# Front-end (per-iteration) statistics, built by the output loop of the
# front end from engine-core outputs (upstream: same module).
# ----------------------------------------------------------------------


@dataclass
class RequestStateStats:
    """Timing of one request, kept by the front end while it runs.

    `arrival_time` is wall-clock (front end); the `*_ts` are engine-core
    monotonic timestamps, comparable across processes on one host.
    """

    num_generation_tokens: int = 0
    arrival_time: float = 0.0
    queued_ts: float = 0.0
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0
    # Seconds from arrival to the first token (wall-clock).
    first_token_latency: float = 0.0


@dataclass
class FinishedRequestStats:
    """Stats of one finished request."""

    finish_reason: Any
    e2e_latency: float = 0.0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    max_tokens_param: int | None = None
    queued_time: float = 0.0
    prefill_time: float = 0.0
    inference_time: float = 0.0
    decode_time: float = 0.0
    mean_time_per_output_token: float = 0.0
    num_cached_tokens: int = 0


class IterationStats:
    """Stats of one batch of engine-core outputs."""

    def __init__(self) -> None:
        self.iteration_timestamp = time.time()
        self.num_generation_tokens = 0
        self.num_prompt_tokens = 0
        self.num_preempted_reqs = 0
        self.finished_requests: list[FinishedRequestStats] = []
        self.time_to_first_tokens_iter: list[float] = []
        self.inter_token_latencies_iter: list[float] = []

    def _time_since(self, start: float) -> float:
        """Seconds from `start` (wall-clock) to this iteration."""
        return self.iteration_timestamp - start

    def update_from_output(
        self,
        output: Any,
        engine_core_timestamp: float,
        is_prefilling: bool,
        prompt_len: int,
        req_stats: RequestStateStats,
    ) -> None:
        """Count one `EngineCoreOutput` of a live request."""
        num_new_generation_tokens = len(output.new_token_ids)
        self.num_generation_tokens += num_new_generation_tokens
        if is_prefilling:
            self.num_prompt_tokens += prompt_len
            first_token_latency = self._time_since(req_stats.arrival_time)
            self.time_to_first_tokens_iter.append(first_token_latency)
            req_stats.first_token_latency = first_token_latency
        req_stats.num_generation_tokens += num_new_generation_tokens
        if output.events is not None:
            self.update_from_events(output.events, req_stats)
        if is_prefilling:
            req_stats.first_token_ts = engine_core_timestamp
        else:
            self.inter_token_latencies_iter.append(engine_core_timestamp - req_stats.last_token_ts)
        req_stats.last_token_ts = engine_core_timestamp

    def update_from_events(self, events: list[Any], req_stats: RequestStateStats) -> None:
        from vllm.v1.engine import EngineCoreEventType

        for event in events:
            if event.type == EngineCoreEventType.QUEUED:
                req_stats.queued_ts = event.timestamp
            elif event.type == EngineCoreEventType.SCHEDULED:
                if req_stats.scheduled_ts == 0.0:  # ignore preemptions
                    req_stats.scheduled_ts = event.timestamp
            elif event.type == EngineCoreEventType.PREEMPTED:
                self.num_preempted_reqs += 1

    def update_from_finished_request(
        self,
        finish_reason: Any,
        num_prompt_tokens: int,
        max_tokens_param: int | None,
        req_stats: RequestStateStats,
        num_cached_tokens: int = 0,
    ) -> None:
        e2e_latency = self._time_since(req_stats.arrival_time)
        # Queued: first QUEUED -> first SCHEDULED; prefill: first SCHEDULED ->
        # first token; decode: first -> last token; inference: prefill + decode.
        queued_time = max(req_stats.scheduled_ts - req_stats.queued_ts, 0.0)
        prefill_time = max(req_stats.first_token_ts - req_stats.scheduled_ts, 0.0)
        decode_time = max(req_stats.last_token_ts - req_stats.first_token_ts, 0.0)
        inference_time = max(req_stats.last_token_ts - req_stats.scheduled_ts, 0.0)
        num_decode_tokens = req_stats.num_generation_tokens - 1
        self.finished_requests.append(
            FinishedRequestStats(
                finish_reason=finish_reason,
                e2e_latency=e2e_latency,
                num_prompt_tokens=num_prompt_tokens,
                num_generation_tokens=req_stats.num_generation_tokens,
                max_tokens_param=max_tokens_param,
                queued_time=queued_time,
                prefill_time=prefill_time,
                inference_time=inference_time,
                decode_time=decode_time,
                mean_time_per_output_token=(
                    decode_time / num_decode_tokens if num_decode_tokens > 0 else 0.0
                ),
                num_cached_tokens=num_cached_tokens,
            )
        )
