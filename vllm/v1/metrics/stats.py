"""Statistics the engine core reports alongside its outputs."""

from dataclasses import dataclass, field


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
