"""Stat loggers: a periodic log line and Prometheus metrics (upstream:
vllm/v1/metrics/loggers.py, same metric names).

`StatLoggerManager.record()` gets, for each batch of engine-core outputs,
the core's `SchedulerStats` (queue lengths, KV-cache usage, prefix-cache
counters) and the front end's `IterationStats` (tokens, latencies, finished
requests). Prometheus metrics carry the labels `model_name` and `engine`;
counters get the `_total` suffix on exposition.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

import prometheus_client

from vllm.logger import init_logger
from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, SchedulerStats
from vllm.v1.spec_decode.metrics import SpecDecodingLogging, SpecDecodingProm

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)

_TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
_ITL_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
_REQUEST_LATENCY_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to `max_value`."""
    buckets: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent += 1


class StatLoggerBase(ABC):
    """Receives the stats of every batch of outputs."""

    @abstractmethod
    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        engine_idx: int = 0,
    ) -> None:
        """Take one batch of stats."""

    def log_engine_initialized(self) -> None:  # noqa: B027 - optional hook
        """Called once the engine is up."""

    def log(self) -> None:  # noqa: B027 - optional periodic hook
        """Called periodically (e.g. every 10 s by the server)."""


class LoggingStatLogger(StatLoggerBase):
    """Logs throughput, queue lengths and cache usage since the last `log()`."""

    def __init__(self, vllm_config: VllmConfig, engine_index: int = 0) -> None:
        self.engine_index = engine_index
        self.vllm_config = vllm_config
        self.last_scheduler_stats = SchedulerStats()
        self.spec_decoding_logging = SpecDecodingLogging()
        self._reset(time.monotonic())
        self.last_log_time = time.monotonic()

    def _reset(self, now: float) -> None:
        self.last_log_time = now
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0
        self.prefix_queries = 0
        self.prefix_hits = 0

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        engine_idx: int = 0,
    ) -> None:
        if iteration_stats is not None:
            self.num_prompt_tokens += iteration_stats.num_prompt_tokens
            self.num_generation_tokens += iteration_stats.num_generation_tokens
        if scheduler_stats is not None:
            self.prefix_queries += scheduler_stats.prefix_cache_stats.queries
            self.prefix_hits += scheduler_stats.prefix_cache_stats.hits
            self.last_scheduler_stats = scheduler_stats
            if scheduler_stats.spec_decoding_stats is not None:
                self.spec_decoding_logging.observe(scheduler_stats.spec_decoding_stats)

    def log(self) -> None:
        now = time.monotonic()
        elapsed = max(now - self.last_log_time, 1e-9)
        stats = self.last_scheduler_stats
        hit_rate = self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0
        logger.info(
            "Engine %03d: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: "
            "%.1f tokens/s, Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%%, "
            "Prefix cache hit rate: %.1f%%",
            self.engine_index,
            self.num_prompt_tokens / elapsed,
            self.num_generation_tokens / elapsed,
            stats.num_running_reqs,
            stats.num_waiting_reqs,
            stats.kv_cache_usage * 100,
            hit_rate * 100,
        )
        self.spec_decoding_logging.log()
        self._reset(now)

    def log_engine_initialized(self) -> None:
        logger.info(
            "Engine %03d: %s KV-cache blocks",
            self.engine_index,
            self.vllm_config.cache_config.num_gpu_blocks,
        )


def unregister_vllm_metrics() -> None:
    """Drop vllm: collectors from the default registry (a second engine in the
    same process re-creates them)."""
    registry = prometheus_client.REGISTRY
    for collector in list(registry._collector_to_names):  # noqa: SLF001 - no public API
        names = registry._collector_to_names.get(collector, [])  # noqa: SLF001
        if any(name.startswith("vllm:") for name in names):
            registry.unregister(collector)


class PrometheusStatLogger(StatLoggerBase):
    """Upstream's `vllm:*` metrics in the default Prometheus registry, one
    labelled series per engine (label `engine`: the DP rank)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        engine_index: int = 0,
        engine_indexes: list[int] | None = None,
    ) -> None:
        unregister_vllm_metrics()
        model_config = vllm_config.model_config
        assert model_config is not None, "metrics are labelled with the served model"
        served = model_config.served_model_name
        model_name = (served[0] if isinstance(served, list) else served) or model_config.model
        self.engine_indexes = list(engine_indexes or [engine_index])
        self.engine_index = self.engine_indexes[0]
        per_engine = {
            idx: {"model_name": model_name, "engine": str(idx)} for idx in self.engine_indexes
        }
        names = ["model_name", "engine"]
        self._make_gauges(names, per_engine)
        self._make_counters(names, per_engine)
        self._make_histograms(names, per_engine, model_config.max_model_len)
        self.spec_decoding_prom = SpecDecodingProm(
            vllm_config.speculative_config,
            names,
            {idx: list(labels.values()) for idx, labels in per_engine.items()},
        )

    def _make_gauges(self, names: list[str], per_engine: dict[int, dict[str, str]]) -> None:
        def gauge(name: str, doc: str) -> dict[int, prometheus_client.Gauge]:
            family = prometheus_client.Gauge(name, doc, names, multiprocess_mode="mostrecent")
            return {idx: family.labels(**labels) for idx, labels in per_engine.items()}

        self.gauge_scheduler_running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.gauge_scheduler_waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.gauge_kv_cache_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )

    def _make_counters(self, names: list[str], per_engine: dict[int, dict[str, str]]) -> None:
        def counter(name: str, doc: str) -> dict[int, prometheus_client.Counter]:
            family = prometheus_client.Counter(name, doc, names)
            return {idx: family.labels(**labels) for idx, labels in per_engine.items()}

        self.counter_num_preempted_reqs = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.counter_prefix_cache_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.counter_prefix_cache_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.counter_prompt_tokens = counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed."
        )
        self.counter_generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        request_success = prometheus_client.Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
        )
        self.counter_request_success = {
            idx: {
                reason: request_success.labels(**labels, finished_reason=reason)
                for reason in ("stop", "length", "abort", "error", "repetition")
            }
            for idx, labels in per_engine.items()
        }

    def _make_histograms(
        self, names: list[str], per_engine: dict[int, dict[str, str]], max_model_len: int
    ) -> None:
        def histogram(
            name: str, doc: str, buckets: Sequence[float]
        ) -> dict[int, prometheus_client.Histogram]:
            family = prometheus_client.Histogram(name, doc, names, buckets=buckets)
            return {idx: family.labels(**labels) for idx, labels in per_engine.items()}

        tokens = build_1_2_5_buckets(max_model_len)
        self.histogram_num_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens
        )
        self.histogram_num_generation_tokens = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self.histogram_max_tokens = histogram(
            "vllm:request_params_max_tokens", "The max_tokens request parameter.", tokens
        )
        self.histogram_iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Number of tokens per engine_step.",
            [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
        )
        self.histogram_ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            _TTFT_BUCKETS,
        )
        self.histogram_itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            _ITL_BUCKETS,
        )
        self.histogram_tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            _ITL_BUCKETS,
        )
        self.histogram_e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            _REQUEST_LATENCY_BUCKETS,
        )
        self.histogram_phase = {}
        for phase, doc in (
            ("queue", "in WAITING phase"),
            ("inference", "in RUNNING phase"),
            ("prefill", "in PREFILL phase"),
            ("decode", "in DECODE phase"),
        ):
            self.histogram_phase[phase] = histogram(
                f"vllm:request_{phase}_time_seconds",
                f"Histogram of time spent {doc} for request.",
                _REQUEST_LATENCY_BUCKETS,
            )

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        engine_idx: int = 0,
    ) -> None:
        """Record the stats of engine `engine_idx` (one of `engine_indexes`)."""
        e = engine_idx if engine_idx in self.gauge_scheduler_running else self.engine_index
        if scheduler_stats is not None:
            self.gauge_scheduler_running[e].set(scheduler_stats.num_running_reqs)
            self.gauge_scheduler_waiting[e].set(scheduler_stats.num_waiting_reqs)
            self.gauge_kv_cache_usage[e].set(scheduler_stats.kv_cache_usage)
            self.counter_prefix_cache_queries[e].inc(scheduler_stats.prefix_cache_stats.queries)
            self.counter_prefix_cache_hits[e].inc(scheduler_stats.prefix_cache_stats.hits)
            if scheduler_stats.spec_decoding_stats is not None:
                self.spec_decoding_prom.observe(scheduler_stats.spec_decoding_stats, e)
        if iteration_stats is not None:
            self._record_iteration(iteration_stats, e)

    def _record_iteration(self, stats: IterationStats, e: int) -> None:
        self.counter_num_preempted_reqs[e].inc(stats.num_preempted_reqs)
        self.counter_prompt_tokens[e].inc(stats.num_prompt_tokens)
        self.counter_generation_tokens[e].inc(stats.num_generation_tokens)
        self.histogram_iteration_tokens[e].observe(
            stats.num_prompt_tokens + stats.num_generation_tokens
        )
        for ttft in stats.time_to_first_tokens_iter:
            self.histogram_ttft[e].observe(ttft)
        for itl in stats.inter_token_latencies_iter:
            self.histogram_itl[e].observe(itl)
        for finished in stats.finished_requests:
            self._record_finished(finished, e)

    def _record_finished(self, finished: FinishedRequestStats, e: int) -> None:
        reason = str(finished.finish_reason)
        if reason in self.counter_request_success[e]:
            self.counter_request_success[e][reason].inc()
        self.histogram_e2e[e].observe(finished.e2e_latency)
        self.histogram_phase["queue"][e].observe(finished.queued_time)
        self.histogram_phase["prefill"][e].observe(finished.prefill_time)
        self.histogram_phase["inference"][e].observe(finished.inference_time)
        self.histogram_phase["decode"][e].observe(finished.decode_time)
        self.histogram_tpot[e].observe(finished.mean_time_per_output_token)
        self.histogram_num_prompt_tokens[e].observe(finished.num_prompt_tokens)
        self.histogram_num_generation_tokens[e].observe(finished.num_generation_tokens)
        if finished.max_tokens_param is not None:
            self.histogram_max_tokens[e].observe(finished.max_tokens_param)


class StatLoggerManager:
    """Fans the stats out to the loggers: per engine (DP rank) a log line and
    the custom loggers; one Prometheus logger with a series per engine."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        engine_idxs: list[int] | None = None,
        custom_stat_loggers: list[type[StatLoggerBase]] | None = None,
        enable_default_loggers: bool = True,
    ) -> None:
        self.engine_idxs = list(engine_idxs or [0])
        self.per_engine_loggers: dict[int, list[StatLoggerBase]] = {}
        for idx in self.engine_idxs:
            loggers: list[StatLoggerBase] = []
            if enable_default_loggers:
                loggers.append(LoggingStatLogger(vllm_config, idx))
            for logger_cls in custom_stat_loggers or []:
                loggers.append(logger_cls(vllm_config, idx))  # type: ignore[call-arg]
            self.per_engine_loggers[idx] = loggers
        self.prometheus_logger: PrometheusStatLogger | None = None
        if enable_default_loggers:
            self.prometheus_logger = PrometheusStatLogger(
                vllm_config, engine_indexes=self.engine_idxs
            )

    @property
    def stat_loggers(self) -> list[StatLoggerBase]:
        """Every logger (the per-engine ones, then Prometheus)."""
        loggers = [lg for lgs in self.per_engine_loggers.values() for lg in lgs]
        if self.prometheus_logger is not None:
            loggers.append(self.prometheus_logger)
        return loggers

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        engine_idx: int = 0,
    ) -> None:
        loggers = self.per_engine_loggers.get(
            engine_idx, self.per_engine_loggers[self.engine_idxs[0]]
        )
        for stat_logger in loggers:
            stat_logger.record(scheduler_stats, iteration_stats, engine_idx)
        if self.prometheus_logger is not None:
            self.prometheus_logger.record(scheduler_stats, iteration_stats, engine_idx)

    def log(self) -> None:
        for stat_logger in self.stat_loggers:
            stat_logger.log()

    def log_engine_initialized(self) -> None:
        for stat_logger in self.stat_loggers:
            stat_logger.log_engine_initialized()
