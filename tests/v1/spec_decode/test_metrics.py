"""Speculative decoding metrics: the scheduler's per-step SpecDecodingStats,
the periodic acceptance log line, the Prometheus counters (upstream names and
labels) and the stats' trip from an engine core process (msgpack)."""

import prometheus_client
import pytest

from tests.v1.core.scheduler_utils import tiny_model_dir
from vllm.config import ModelConfig, ParallelConfig, VllmConfig
from vllm.config.speculative import SpeculativeConfig
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.engine.core_client_mp import _restore_stats
from vllm.v1.metrics.loggers import LoggingStatLogger, PrometheusStatLogger
from vllm.v1.metrics.stats import SchedulerStats
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder
from vllm.v1.spec_decode.metrics import SpecDecodingLogging, SpecDecodingStats

pytestmark = pytest.mark.cpu_test


def make_stats(num_spec_tokens: int, drafts: list[tuple[int, int]]) -> SpecDecodingStats:
    stats = SpecDecodingStats.new(num_spec_tokens)
    for num_draft_tokens, num_accepted in drafts:
        stats.observe_draft(num_draft_tokens, num_accepted)
    return stats


def vllm_config(num_speculative_tokens: int | None) -> VllmConfig:
    model_config = ModelConfig(model=tiny_model_dir(), dtype="float32", max_model_len=256)
    spec = None
    if num_speculative_tokens is not None:
        spec = SpeculativeConfig(
            method="ngram",
            num_speculative_tokens=num_speculative_tokens,
            target_model_config=model_config,
            target_parallel_config=ParallelConfig(),
        )
    return VllmConfig(model_config=model_config, speculative_config=spec)


def test_observe_draft_counts_per_position():
    stats = make_stats(3, [(3, 3), (3, 1), (2, 0), (1, 1)])
    assert stats.num_drafts == 4
    assert stats.num_draft_tokens == 9
    assert stats.num_accepted_tokens == 5
    assert stats.num_accepted_tokens_per_pos == [3, 1, 1]
    assert stats.num_draft_tokens_per_pos == [4, 3, 2]


@pytest.mark.parametrize("draft", [(2, 3), (4, 1), (1, -1)])
def test_observe_draft_refuses_impossible_counts(draft):
    with pytest.raises(ValueError, match="does not fit num_speculative_tokens=3"):
        SpecDecodingStats.new(3).observe_draft(*draft)


def test_log_line():
    logging = SpecDecodingLogging()
    lines: list[tuple] = []
    logging.log(lambda *args: lines.append(args))
    assert lines == []  # nothing verified: no line
    logging.observe(make_stats(3, [(3, 3), (3, 1)]))
    logging.observe(make_stats(3, [(2, 0), (3, 2)]))
    logging.log(lambda *args: lines.append(args))
    ((fmt, mean_len, accepted_tput, drafted_tput, accepted, drafted, rates, rate),) = lines
    assert fmt.startswith("SpecDecoding metrics: Mean acceptance length: %.2f, ")
    assert "Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%" in fmt
    assert mean_len == pytest.approx(1 + 6 / 4)
    assert (accepted, drafted) == (6, 11)
    assert accepted_tput > 0 and drafted_tput == pytest.approx(accepted_tput * 11 / 6)
    assert rates == "0.750, 0.500, 0.250"
    assert rate == pytest.approx(600 / 11)
    # A new interval starts empty.
    logging.log(lambda *args: lines.append(args))
    assert len(lines) == 1


def test_logging_stat_logger_feeds_the_line():
    stat_logger = LoggingStatLogger(vllm_config(2))
    stat_logger.record(SchedulerStats(spec_decoding_stats=make_stats(2, [(2, 1)])), None)
    stat_logger.record(SchedulerStats(), None)  # a step without drafts
    assert stat_logger.spec_decoding_logging.num_drafts == [1]
    stat_logger.log()
    assert stat_logger.spec_decoding_logging.num_drafts == []


def sample(name: str, **labels: str) -> float | None:
    return prometheus_client.REGISTRY.get_sample_value(
        name, {"model_name": tiny_model_dir(), "engine": "0", **labels}
    )


def test_prometheus_counters():
    stat_logger = PrometheusStatLogger(vllm_config(3))
    stat_logger.record(SchedulerStats(spec_decoding_stats=make_stats(3, [(3, 3), (3, 1)])), None)
    stat_logger.record(SchedulerStats(spec_decoding_stats=make_stats(3, [(2, 0)])), None)
    assert sample("vllm:spec_decode_num_drafts_total") == 3
    assert sample("vllm:spec_decode_num_draft_tokens_total") == 8
    assert sample("vllm:spec_decode_num_accepted_tokens_total") == 4
    per_pos = [
        sample("vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
        for i in range(3)
    ]
    assert per_pos == [2, 1, 1]
    assert sample("vllm:spec_decode_num_accepted_tokens_per_pos_total", position="3") is None


def test_no_spec_counters_without_speculation():
    stat_logger = PrometheusStatLogger(vllm_config(None))
    stat_logger.record(SchedulerStats(), None)
    assert sample("vllm:spec_decode_num_drafts_total") is None


def test_stats_cross_the_process_boundary():
    """The engine core process sends SchedulerStats as msgpack; the client
    rebuilds the dataclasses, SpecDecodingStats included."""
    stats = SchedulerStats(num_running_reqs=2, spec_decoding_stats=make_stats(2, [(2, 1)]))
    frames = MsgpackEncoder().encode(EngineCoreOutputs(scheduler_stats=stats))
    outputs = MsgpackDecoder(EngineCoreOutputs).decode(frames)
    _restore_stats(outputs)
    assert outputs.scheduler_stats == stats
    assert isinstance(outputs.scheduler_stats.spec_decoding_stats, SpecDecodingStats)
