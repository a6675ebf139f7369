"""Speculative decoding at engine start-up: bad input and unbuilt methods or
options are clear errors naming them; speculative configs run on the V1 model
runner (Model Runner V2 falls back with upstream's warning, forcing V2 is an
error) and with upstream's async-scheduling rule (ngram: an explicit True is
refused, the default turns it off; draft_model and EAGLE run async)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from vllm import LLM
from vllm.engine.arg_utils import EngineArgs
from vllm.logger import _log_once

NGRAM = {"method": "ngram", "num_speculative_tokens": 2}


def _config(model: str, **kwargs):
    return EngineArgs(model=model, device="cpu", **kwargs).create_engine_config()


@pytest.fixture
def warnings() -> Iterator[list[str]]:
    """Warnings logged under `vllm` (propagation is off; `*_once` cache cleared)."""
    records: list[str] = []

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                records.append(record.getMessage())

    handler = Handler()
    _log_once.cache_clear()
    logging.getLogger("vllm").addHandler(handler)
    yield records
    logging.getLogger("vllm").removeHandler(handler)


def test_bad_input_is_refused_at_start_up(tiny_model_dir):
    model = tiny_model_dir("llama")
    with pytest.raises(ValueError, match="not a speculative method"):
        LLM(model=model, speculative_config={"method": "nope", "num_speculative_tokens": 2})
    for k in (0, -1):
        with pytest.raises(ValueError, match="greater than zero"):
            _config(model, speculative_config={"method": "ngram", "num_speculative_tokens": k})
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        _config(model, speculative_config={"method": "ngram"})


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"method": "ngram_gpu"}, "method 'ngram_gpu' is not built"),
        ({"num_speculative_tokens_per_batch_size": [(1, 4, 2)]}, "per_batch_size"),
        ({"rejection_sample_method": "block"}, "rejection_sample_method='block'"),
    ],
)
def test_unbuilt_method_or_option_is_named(tiny_model_dir, extra, match):
    with pytest.raises(NotImplementedError, match=match):
        _config(tiny_model_dir("llama"), speculative_config={**NGRAM, **extra})


def test_pipeline_parallel_or_pooling_speculation_is_refused(tiny_model_dir):
    with pytest.raises(NotImplementedError, match="pipeline_parallel_size > 1"):
        _config(tiny_model_dir("llama"), speculative_config=NGRAM, pipeline_parallel_size=2)
    with pytest.raises(NotImplementedError, match="speculative_config with a pooling model"):
        _config(tiny_model_dir("llama"), speculative_config=NGRAM, runner="pooling")


def test_v2_default_falls_back_to_v1_with_upstreams_warning(tiny_model_dir, monkeypatch, warnings):
    model = tiny_model_dir("llama")
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    assert _config(model).use_v2_model_runner  # a dense llama defaults to V2
    config = _config(model, speculative_config=NGRAM)
    assert not config.use_v2_model_runner
    assert (
        "Model Runner V2 does not yet support ngram/ngram_gpu speculative decoding; "
        "using the V1 model runner instead." in warnings
    )
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(ValueError, match="VLLM_USE_V2_MODEL_RUNNER=1.*ngram"):
        _ = config.use_v2_model_runner
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    assert not config.use_v2_model_runner


def test_async_scheduling_rules(tiny_model_dir, warnings):
    model = tiny_model_dir("llama")
    mp = {"distributed_executor_backend": "mp"}  # async would default on
    assert _config(model, **mp).scheduler_config.async_scheduling
    config = _config(model, speculative_config=NGRAM, **mp)
    assert config.scheduler_config.async_scheduling is False
    assert any("Async scheduling not supported with ngram-based" in w for w in warnings)
    with pytest.raises(ValueError, match="async scheduling is only supported with EAGLE"):
        _config(model, speculative_config=NGRAM, async_scheduling=True)
    # draft_model (and the EAGLE family) run async, as upstream: an explicit
    # True stays on, and the default follows the executor's rule (on with
    # multiprocess workers, off with one CPU worker).
    draft = {"model": model, "num_speculative_tokens": 2}
    config = _config(model, speculative_config=draft, async_scheduling=True)
    assert config.scheduler_config.async_scheduling is True
    config = _config(model, speculative_config=draft, **mp)
    assert config.scheduler_config.async_scheduling is True
    assert config.speculative_config is not None
    assert config.speculative_config.method == "draft_model"
    assert _config(model, speculative_config=draft).scheduler_config.async_scheduling is False
