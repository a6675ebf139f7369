"""Speculative decoding metrics (upstream: vllm/v1/spec_decode/metrics.py).

The scheduler counts, per step, the drafts it verified
(`SpecDecodingStats`, sent to the front end in `SchedulerStats`); the front
end's stat loggers aggregate them: `SpecDecodingLogging` into the periodic log
line, `SpecDecodingProm` into Prometheus counters.

A "draft" is one request's run of draft tokens verified in one step; its
accepted tokens are the leading draft tokens the target model agreed with
(the bonus token the target samples after them is not counted).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import prometheus_client

from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.config import SpeculativeConfig

logger = init_logger(__name__)


@dataclass
class SpecDecodingStats:
    """The drafts the scheduler verified in one step, over all requests."""

    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # [num_spec_tokens]: drafts whose token at position i was accepted.
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    # [num_spec_tokens]: drafts that had a token at position i.
    num_draft_tokens_per_pos: list[int] = field(default_factory=list)

    @classmethod
    def new(cls, num_spec_tokens: int) -> SpecDecodingStats:
        return cls(
            num_spec_tokens=num_spec_tokens,
            num_accepted_tokens_per_pos=[0] * num_spec_tokens,
            num_draft_tokens_per_pos=[0] * num_spec_tokens,
        )

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Count one request's draft: `num_draft_tokens` verified, the first
        `num_accepted_tokens` of them accepted."""
        if not 0 <= num_accepted_tokens <= num_draft_tokens <= self.num_spec_tokens:
            raise ValueError(
                f"A draft of {num_draft_tokens} tokens with {num_accepted_tokens} accepted "
                f"does not fit num_speculative_tokens={self.num_spec_tokens}"
            )
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for i in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[i] += 1
        for i in range(num_draft_tokens):
            self.num_draft_tokens_per_pos[i] += 1

    @classmethod
    def from_wire(
        cls, value: SpecDecodingStats | dict[str, Any] | None
    ) -> SpecDecodingStats | None:
        """The stats as sent by an engine core process: its msgpack decodes
        the dataclass as a plain dict (see `SchedulerStats.__post_init__`)."""
        if value is None or isinstance(value, SpecDecodingStats):
            return value
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in value.items() if k in known})


class SpecDecodingLogging:
    """Aggregates `SpecDecodingStats` between two periodic log lines."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.num_drafts: list[int] = []
        self.num_draft_tokens: list[int] = []
        self.num_accepted_tokens: list[int] = []
        self.accepted_tokens_per_pos_lists: list[list[int]] = []
        self.last_log_time = time.monotonic()

    def observe(self, spec_decoding_stats: SpecDecodingStats) -> None:
        self.num_drafts.append(spec_decoding_stats.num_drafts)
        self.num_draft_tokens.append(spec_decoding_stats.num_draft_tokens)
        self.num_accepted_tokens.append(spec_decoding_stats.num_accepted_tokens)
        self.accepted_tokens_per_pos_lists.append(spec_decoding_stats.num_accepted_tokens_per_pos)

    def log(self, log_fn: Callable[..., None] = logger.info) -> None:
        """One line (upstream's wording), then start a new interval. Nothing
        when no draft was verified since the last line."""
        num_drafts = int(np.sum(self.num_drafts))
        if num_drafts == 0:
            self.reset()
            return
        num_draft_tokens = int(np.sum(self.num_draft_tokens))
        num_accepted_tokens = int(np.sum(self.num_accepted_tokens))
        elapsed = time.monotonic() - self.last_log_time
        draft_throughput = num_draft_tokens / elapsed if elapsed > 0 else 0.0
        accepted_throughput = num_accepted_tokens / elapsed if elapsed > 0 else 0.0
        acceptance_rate = (
            num_accepted_tokens / num_draft_tokens * 100 if num_draft_tokens else float("nan")
        )
        # By convention the mean acceptance length counts the bonus token.
        mean_acceptance_length = 1 + num_accepted_tokens / num_drafts
        # [intervals, num_spec_tokens] summed over intervals, per draft.
        per_pos = np.sum(np.array(self.accepted_tokens_per_pos_lists), axis=0) / num_drafts
        rates = ", ".join(f"{p:.3f}" for p in per_pos)
        log_fn(
            "SpecDecoding metrics: Mean acceptance length: %.2f, "
            "Accepted throughput: %.2f tokens/s, Drafted throughput: %.2f tokens/s, "
            "Accepted: %d tokens, Drafted: %d tokens, "
            "Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%",
            mean_acceptance_length,
            accepted_throughput,
            draft_throughput,
            num_accepted_tokens,
            num_draft_tokens,
            rates,
            acceptance_rate,
        )
        self.reset()


class SpecDecodingProm:
    """Speculative decoding counters in Prometheus (upstream names; counters
    get the `_total` suffix on exposition).

    Acceptance rate: rate(vllm:spec_decode_num_accepted_tokens_total) /
    rate(vllm:spec_decode_num_draft_tokens_total). Mean acceptance length:
    1 + rate(..._num_accepted_tokens_total) / rate(..._num_drafts_total).
    Per-position acceptance rate: ..._num_accepted_tokens_per_pos_total{position=i}
    / ..._num_drafts_total.
    """

    def __init__(
        self,
        speculative_config: SpeculativeConfig | None,
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[str]],
    ) -> None:
        self.spec_decoding_enabled = speculative_config is not None
        if speculative_config is None:
            return

        def counter(name: str, doc: str) -> dict[int, Any]:
            metric = prometheus_client.Counter(name, doc, labelnames)
            return {idx: metric.labels(*lv) for idx, lv in per_engine_labelvalues.items()}

        self.counter_spec_decode_num_drafts = counter(
            "vllm:spec_decode_num_drafts", "Number of spec decoding drafts."
        )
        self.counter_spec_decode_num_draft_tokens = counter(
            "vllm:spec_decode_num_draft_tokens", "Number of draft tokens."
        )
        self.counter_spec_decode_num_accepted_tokens = counter(
            "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."
        )
        num_spec_tokens = speculative_config.num_speculative_tokens
        assert num_spec_tokens is not None
        per_pos = prometheus_client.Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            [*labelnames, "position"],
        )
        self.counter_spec_decode_num_accepted_tokens_per_pos = {
            idx: [per_pos.labels(*lv, str(pos)) for pos in range(num_spec_tokens)]
            for idx, lv in per_engine_labelvalues.items()
        }

    def observe(self, spec_decoding_stats: SpecDecodingStats, engine_idx: int = 0) -> None:
        if not self.spec_decoding_enabled:
            return
        self.counter_spec_decode_num_drafts[engine_idx].inc(spec_decoding_stats.num_drafts)
        self.counter_spec_decode_num_draft_tokens[engine_idx].inc(
            spec_decoding_stats.num_draft_tokens
        )
        self.counter_spec_decode_num_accepted_tokens[engine_idx].inc(
            spec_decoding_stats.num_accepted_tokens
        )
        per_pos = spec_decoding_stats.num_accepted_tokens_per_pos
        for pos, counter in enumerate(
            self.counter_spec_decode_num_accepted_tokens_per_pos.get(engine_idx, [])
        ):
            counter.inc(per_pos[pos])
