"""Multi-node data parallelism on the mp backend, two "nodes" as separate
process groups on loopback: the primary `vllm serve -dp 2 -dpl 1` (API
server, coordinator, engine rank 0) and a secondary `vllm serve --headless
-dp 2 -dpl 1 -dpr 1 -dpa 127.0.0.1 -dpp PORT` (engine rank 1 only), whose
engine joins through the primary's tcp handshake socket, as upstream's
multi-node launch. Greedy outputs equal the single-engine reference and both
engines answer; the secondary exits cleanly on SIGTERM. A secondary started
with another -dp is refused by the primary at start-up, in bounded time.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from tests.entrypoints.openai.conftest import REPO_ROOT, RemoteOpenAIServer, still_running
from tests.utils import hf_greedy
from tests.v1.distributed.test_dp_serve import engine_metric
from vllm.distributed.utils import get_open_port

PROMPTS = [[1, 5, 9, 13], [2, 4, 6], [7, 7, 8, 9, 10], [3], [11, 12], [20, 21, 22, 23, 24, 25]]
COMMON = ["--max-model-len", "256", "--dtype", "float32", "--kv-cache-memory-bytes", "8000000"]


@pytest.fixture(scope="module")
def model(tiny_model_dir) -> str:
    return tiny_model_dir("llama")


class Secondary:
    """`vllm serve --headless` in its own process group (a second node)."""

    def __init__(self, model: str, dp: int, rpc_port: int, log_path: str) -> None:
        cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model, *COMMON]
        cmd += ["--headless", "-dp", str(dp), "-dpl", "1", "-dpr", "1"]
        cmd += ["-dpa", "127.0.0.1", "-dpp", str(rpc_port)]
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                cmd,
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.ps = psutil.Process(self.proc.pid)

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self, timeout: float = 30) -> tuple[int, list[psutil.Process]]:
        """SIGTERM, wait; (exit code, its processes still alive after it)."""
        children = self.ps.children(recursive=True) if self.proc.poll() is None else []
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            code = self.proc.wait(10)
        alive = still_running(children, timeout=15)
        for proc in alive:
            proc.kill()
        return code, alive


async def _complete_all(srv, model, prompts, max_tokens) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=120) as client:

        async def one(prompt):
            body = {
                "model": model,
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0,
                "return_token_ids": True,
            }
            return await client.post(srv.url_for("v1/completions"), json=body)

        return list(await asyncio.gather(*(one(p) for p in prompts)))


def test_headless_secondary_serves_dp_rank_1(model, tmp_path):
    rpc_port = get_open_port()
    secondary = Secondary(model, 2, rpc_port, str(tmp_path / "secondary.log"))
    srv = None
    try:
        srv = RemoteOpenAIServer(
            model, [*COMMON, "-dp", "2", "-dpl", "1", "-dpp", str(rpc_port)], wait=False
        )
        srv.wait_until_healthy()
        expected = hf_greedy(model, PROMPTS, 8)
        responses = asyncio.run(_complete_all(srv, model, PROMPTS, 8))
        for response, want in zip(responses, expected):
            assert response.status_code == 200, response.text
            assert response.json()["choices"][0]["token_ids"][: len(want)] == want
        per_engine = engine_metric(srv, "vllm:request_success_total")
        assert set(per_engine) == {"0", "1"} and all(v > 0 for v in per_engine.values())
        # Engine rank 1 is the secondary's child, not the primary's.
        assert secondary.ps.children(recursive=True)
    finally:
        if srv is not None:
            srv.stop()
        code, alive = secondary.stop()
    assert code == 0, secondary.log()[-3000:]
    assert not alive


def test_mismatched_dp_size_fails_at_startup(model, tmp_path):
    rpc_port = get_open_port()
    secondary = Secondary(model, 3, rpc_port, str(tmp_path / "secondary.log"))
    log_path = str(tmp_path / "primary.log")
    start = time.monotonic()
    srv = RemoteOpenAIServer(
        model,
        [*COMMON, "-dp", "2", "-dpl", "1", "-dpp", str(rpc_port)],
        wait=False,
        log_path=log_path,
    )
    try:
        code = srv.proc.wait(240)
    finally:
        srv.stop()
        secondary.stop()
    took = time.monotonic() - start
    with open(log_path, errors="replace") as f:
        log = f.read()
    assert code != 0
    assert "start every node with the same --data-parallel-size" in log, log[-3000:]
    assert took < 240
