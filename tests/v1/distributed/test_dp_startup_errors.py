"""Bad data-parallel start-ups fail with a clear error in bounded time (no
hang): remote engines that never join, a remote node started with another
--data-parallel-size, more local engines than CPU cores (`vllm serve`)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.entrypoints.openai.conftest import REPO_ROOT, get_open_port
from vllm.engine.arg_utils import EngineArgs
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.core_proc import EngineCoreProc
from vllm.v1.engine.utils import CoreEngineProcManager, launch_core_engines
from vllm.v1.executor.abstract import Executor


def _config(model: str, port: int, headless: bool = False, **kwargs):
    args = EngineArgs(
        model=model,
        device="cpu",
        max_model_len=128,
        kv_cache_memory_bytes=4_000_000,
        data_parallel_rpc_port=port,
        **kwargs,
    )
    return args.create_engine_config(UsageContext.OPENAI_API_SERVER, headless=headless)


def _close(launch) -> None:
    if launch is not None:
        if launch.engine_manager is not None:
            launch.engine_manager.close()
        if launch.coordinator is not None:
            launch.coordinator.close()


def test_remote_engine_that_never_joins_times_out(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("VLLM_ENGINE_READY_TIMEOUT_S", "12")
    config = _config(
        tiny_model_dir("llama"), get_open_port(), data_parallel_size=2, data_parallel_size_local=1
    )
    launch = None
    t0 = time.monotonic()
    try:
        with (
            pytest.raises(TimeoutError, match=r"engine core\(s\) \[.*1\]"),
            launch_core_engines(config, Executor.get_class(config), False) as launch,
        ):
            pass
    finally:
        _close(launch)
    assert time.monotonic() - t0 < 60


def test_mismatched_dp_sizes_across_nodes_are_refused(tiny_model_dir):
    """The head runs -dp 2 -dpl 1; a headless node says -dp 3: its HELLO is
    refused at once, naming the flag."""
    model, port = tiny_model_dir("llama"), get_open_port()
    head = _config(model, port, data_parallel_size=2, data_parallel_size_local=1)
    remote = _config(
        model,
        port,
        headless=True,
        data_parallel_size=3,
        data_parallel_size_local=1,
        data_parallel_start_rank=1,
    )
    launch = remote_manager = None
    t0 = time.monotonic()
    try:
        with (
            pytest.raises(RuntimeError, match=r"data_parallel_size=3 \(--data-parallel-size\)"),
            launch_core_engines(head, Executor.get_class(head), False) as launch,
        ):
            remote_manager = CoreEngineProcManager(
                EngineCoreProc.run_engine_core,
                local_engine_count=1,
                vllm_config=remote,
                local_client=False,
                handshake_address=f"tcp://127.0.0.1:{port}",
                executor_class=Executor.get_class(remote),
                log_stats=False,
                start_index=1,
            )
    finally:
        _close(launch)
        if remote_manager is not None:
            remote_manager.close()
    assert time.monotonic() - t0 < 120


def test_serve_with_more_engines_than_cores_exits_with_the_reason(tiny_model_dir):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.cli.main",
            "serve",
            tiny_model_dir("llama"),
            "--port",
            str(get_open_port()),
            "-dp",
            "64",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "larger than the" in result.stderr and "--data-parallel-size" in result.stderr
