"""A start-up failure inside the engine core makes `vllm serve` exit with an
error and leaves no process behind (upstream: tests/v1/shutdown/test_startup_error.py)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from tests.entrypoints.openai.conftest import REPO_ROOT, get_open_port, still_running


def test_engine_startup_failure_exits_cleanly(tiny_model_dir):
    # 4 KiB of KV cache cannot hold one 256-token request: the core fails while
    # sizing the cache, after the model loaded.
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        tiny_model_dir("llama"),
        "--host",
        "127.0.0.1",
        "--port",
        str(get_open_port()),
        "--dtype",
        "float32",
        "--max-model-len",
        "256",
        "--kv-cache-memory-bytes",
        "4096",
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    ps = psutil.Process(proc.pid)
    children: set[int] = set()
    while proc.poll() is None:
        try:
            children |= {c.pid for c in ps.children(recursive=True)}
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "Engine core initialization failed" in out
    assert "KV cache" in out or "max seq len" in out
    assert children, "the engine core ran in a child process"
    # Children (the engine core, multiprocessing's resource tracker) are gone
    # moments after the server.
    procs = [psutil.Process(pid) for pid in children if psutil.pid_exists(pid)]
    assert not still_running(procs, timeout=10)
