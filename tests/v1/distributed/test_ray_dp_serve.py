"""`vllm serve -dp 2 -dpl 1 -tp 2 --data-parallel-backend ray` on a two-node
Ray cluster (one machine, see ray_cluster.py; shared by the package's Ray
tests, conftest.py): DP rank 0's engine-core actor
and its two TP workers (Ray actors) on the head node (the server's), rank 1's
on the other node. Greedy outputs
equal the single-engine reference and both engines answer (the `engine`
label on /metrics); stopping the other node under load fails the requests
in flight with an error (no hang), /health turns 503, and the server and its
engine actors exit. Bad input fails at start-up in bounded time: -dp larger
than the cluster (a message naming -dp) and a Ray address that does not
answer (naming the address).
"""

from __future__ import annotations

import asyncio
import time

import httpx
import psutil
import pytest

from tests.entrypoints.openai.conftest import RemoteOpenAIServer
from tests.utils import hf_greedy
from tests.v1.distributed.ray_cluster import HEAD_IP, RayCluster, ray_env
from tests.v1.distributed.test_dp_serve import engine_metric

PROMPTS = [[1, 5, 9, 13], [2, 4, 6], [7, 7, 8, 9, 10], [3], [11, 12], [20, 21, 22, 23, 24, 25]]
START_TIMEOUT_S = 420
SERVE_ARGS = [
    "--max-model-len",
    "256",
    "--dtype",
    "float32",
    "--kv-cache-memory-bytes",
    "8000000",
    "-dp",
    "2",
    "-dpl",
    "1",
    "-tp",
    "2",
    "--data-parallel-backend",
    "ray",
    # One API server (with several, their parent stops them all when an engine dies).
    "--api-server-count",
    "1",
]


@pytest.fixture(scope="module")
def model(tiny_model_dir) -> str:
    return tiny_model_dir("llama")


def _cluster_env(cluster: RayCluster) -> dict[str, str]:
    """A server on the head node: Ray's address, and this host's IP as the
    head's (upstream's VLLM_HOST_IP), which -dpb ray takes as the default -dpa."""
    return ray_env() | {"RAY_ADDRESS": cluster.address, "VLLM_HOST_IP": HEAD_IP}


def _engine_actor_pids() -> list[int]:
    """The engine-core actors and their TP worker actors (Ray names each
    worker process after its actor class)."""
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if any(
            "EngineCoreActor" in part or "RayWorkerWrapper" in part
            for part in (p.info["cmdline"] or [])
        )
    ]


def _start(model: str, args: list[str], env: dict[str, str], log: str) -> RemoteOpenAIServer:
    return RemoteOpenAIServer(model, args, env=env, wait=False, log_path=log)


def _failed_start(model, args, env, tmp_path, timeout: float) -> tuple[int, str, float]:
    """Start a server that must fail: (exit code, its log, seconds taken)."""
    log = str(tmp_path / "serve.log")
    start = time.monotonic()
    srv = _start(model, args, env, log)
    try:
        code = srv.proc.wait(timeout)
    finally:
        srv.stop()
    with open(log) as f:
        return code, f.read(), time.monotonic() - start


async def _complete_all(srv, model, prompts, max_tokens) -> list[httpx.Response | BaseException]:
    async with httpx.AsyncClient(timeout=180) as client:

        async def one(prompt):
            body = {
                "model": model,
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "return_token_ids": True,
            }
            return await client.post(srv.url_for("v1/completions"), json=body)

        return list(await asyncio.gather(*(one(p) for p in prompts), return_exceptions=True))


def test_dp2_tp2_ray_equals_single_engine_then_a_node_is_lost(
    two_node_ray_cluster, model, tmp_path
):
    cluster = two_node_ray_cluster
    # Kept alive after the engine's death (else it shuts itself down, as
    # upstream), so that /health can be asked.
    env = _cluster_env(cluster) | {"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"}
    srv = _start(model, SERVE_ARGS, env, str(tmp_path / "serve.log"))
    try:
        # Six processes (2 engine actors, 4 TP workers) load on two shared
        # cores: over 180 s at load 14.
        srv.wait_until_healthy(timeout=START_TIMEOUT_S)
        expected = hf_greedy(model, PROMPTS, 8)
        responses = asyncio.run(_complete_all(srv, model, PROMPTS, 8))
        for response, want in zip(responses, expected):
            assert isinstance(response, httpx.Response) and response.status_code == 200
            assert response.json()["choices"][0]["token_ids"] == want
        per_engine = engine_metric(srv, "vllm:request_success_total")
        assert set(per_engine) == {"0", "1"} and all(v > 0 for v in per_engine.values())
        # Ray worker processes, not the server's children: 2 engines + 4 TP workers.
        assert len(_engine_actor_pids()) == 6

        async def load_then_lose_node():
            task = asyncio.ensure_future(_complete_all(srv, model, PROMPTS * 2, 200))
            await asyncio.sleep(3)
            cluster.stop_node(cluster.nodes[1])
            return await asyncio.wait_for(task, 120)  # no request hangs

        start = time.monotonic()
        results = asyncio.run(load_then_lose_node())
        assert time.monotonic() - start < 120
        failed = [r for r in results if not isinstance(r, httpx.Response) or r.status_code != 200]
        assert failed, "the requests in flight on the lost engine must fail"
        assert httpx.get(srv.url_for("health"), timeout=10).status_code == 503
    finally:
        srv.stop()
    deadline = time.monotonic() + 60
    while _engine_actor_pids() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _engine_actor_pids(), "engine actors outlived the server"


def test_dp_larger_than_the_ray_cluster_fails_at_startup(ray_cluster, model, tmp_path):
    # -dp 3 -dpl 1 -tp 2: one rank per node, and the cluster has two nodes at
    # most (one when it runs after the node loss above).
    args = [*SERVE_ARGS]
    args[args.index("-dp") + 1] = "3"
    code, log, took = _failed_start(model, args, _cluster_env(ray_cluster), tmp_path, timeout=180)
    assert code != 0
    assert "data_parallel_size=3 (-dp/--data-parallel-size)" in log
    assert took < 180


def test_ray_address_that_does_not_answer_fails_at_startup(model, tmp_path):
    env = ray_env() | {"RAY_ADDRESS": "127.0.0.1:9"}
    code, log, took = _failed_start(model, SERVE_ARGS, env, tmp_path, timeout=120)
    assert code != 0
    assert "Cannot reach the Ray cluster at '127.0.0.1:9'" in log
    assert took < 120
