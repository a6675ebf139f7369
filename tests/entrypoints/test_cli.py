"""The `vllm` console script: bench throughput / latency on a tiny model, the
serve flags, and the root benchmark scripts (upstream: tests/benchmarks/)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VLLM = str(Path(sys.executable).parent / "vllm")
# A small engine: tiny model, small KV cache.
ENGINE = ["--dtype", "float32", "--max-model-len", "64", "--kv-cache-memory-bytes", "8M"]


def _run(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return tiny_model_dir("qwen2")


def test_version_and_help():
    from vllm.version import __version__

    assert _run([VLLM, "--version"]).strip() == __version__
    assert "throughput" in _run([VLLM, "bench", "--help"])


def test_bench_throughput(model):
    out = _run(
        [
            VLLM,
            "bench",
            "throughput",
            "--model",
            model,
            "--dataset-name",
            "random",
            "--input-len",
            "16",
            "--output-len",
            "8",
            "--num-prompts",
            "6",
            *ENGINE,
        ]
    )
    m = re.search(
        r"^Throughput: ([\d.]+) requests/s, ([\d.]+) total tokens/s, "
        r"([\d.]+) output tokens/s$",
        out,
        re.M,
    )
    assert m, out
    req_s, total_s, out_s = map(float, m.groups())
    # 16 prompt + 8 output tokens per request, every request ran to its length.
    assert req_s > 0 and abs(total_s / req_s - 24) < 1e-2 * 24 and abs(out_s / req_s - 8) < 0.1
    assert re.search(r"^Total num prompt tokens:  96$", out, re.M)
    assert re.search(r"^Total num output tokens:  48$", out, re.M)


def test_bench_latency(model):
    out = _run(
        [
            VLLM,
            "bench",
            "latency",
            "--model",
            model,
            "--input-len",
            "8",
            "--output-len",
            "4",
            "--batch-size",
            "2",
            "--n",
            "2",
            "--num-iters-warmup",
            "1",
            "--num-iters",
            "3",
            *ENGINE,
        ]
    )
    avg = re.search(r"^Avg latency: ([\d.e-]+) seconds$", out, re.M)
    assert avg and float(avg.group(1)) > 0, out
    values = []
    for p in (10, 25, 50, 75, 90, 99):
        m = re.search(rf"^{p}% percentile latency: ([\d.e-]+) seconds$", out, re.M)
        assert m, out
        values.append(float(m.group(1)))
    assert values == sorted(values)


def test_benchmark_script_runs_the_same_code(model):
    out = _run(
        [
            sys.executable,
            "benchmarks/benchmark_throughput.py",
            "--model",
            model,
            "--input-len",
            "8",
            "--output-len",
            "4",
            "--num-prompts",
            "2",
            *ENGINE,
        ]
    )
    assert re.search(r"^Throughput: [\d.]+ requests/s", out, re.M), out


def test_serve_help_lists_server_flags():
    # The server itself is tested end to end in tests/entrypoints/openai/.
    out = _run([VLLM, "serve", "--help"])
    for flag in (
        "--host",
        "--port",
        "--api-key",
        "--chat-template",
        "--served-model-name",
        "--max-model-len",
        "--max-num-seqs",
    ):
        assert flag in out, flag
