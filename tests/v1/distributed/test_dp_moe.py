"""`vllm serve -dp 2` with a mixture-of-experts model: the two engine cores
step in lock-step waves (DPEngineCoreProc) and their MoE layers exchange
tokens every forward pass, with experts split by tensor slices (Mixtral) or
by expert parallelism (`-ep`: Qwen2-MoE with its shared expert, DeepSeek-V2
with MLA and grouped top-k). Greedy tokens equal transformers' (one engine,
one process); a lone request finishes while the other engine has nothing
(it runs dummy batches); concurrent requests of different lengths finish
(the engines' token counts differ every step) and both engines serve some;
after a wave the engines go idle; every process exits on shutdown."""

from __future__ import annotations

import asyncio
import time

import httpx
import psutil
import pytest

from tests.entrypoints.openai.conftest import RemoteOpenAIServer, wait_exited
from tests.models.zoo_utils import build_zoo_model
from tests.utils import hf_greedy

MAX_TOKENS = 12
# Tokens per request of the kill-under-load test: with 110 (its old figure)
# all six finished within the second before the kill once the CPU GEMMs got
# faster; the tiny Mixtral's context is 512 (max_position_embeddings).
LOAD_TOKENS = 440
PROMPTS = [[5, 17, 99, i, 250, 7, 8][: 3 + i] for i in range(1, 6)] + [list(range(30, 70))]


# Two engines load on the same two cores next to other tests: time to spare.
START_TIMEOUT_S = 300


def _start(
    model_dir: str,
    extra: list[str],
    log: str,
    env: dict[str, str] | None = None,
    max_model_len: int = 128,
):
    args = _server_args(extra, max_model_len)
    server = RemoteOpenAIServer(model_dir, args, env=env, wait=False, log_path=log)
    try:
        server.wait_until_healthy(timeout=START_TIMEOUT_S)
    except BaseException:
        server.stop()
        raise
    return server


def _server_args(extra: list[str], max_model_len: int = 128) -> list[str]:
    return [
        "--dtype",
        "float32",
        "--max-model-len",
        str(max_model_len),
        "--kv-cache-memory-bytes",
        str(8 * 2**20),
        "-dp",
        "2",
        *extra,
    ]


async def _complete_all(server: RemoteOpenAIServer, prompts: list[list[int]]) -> list[list[int]]:
    async with httpx.AsyncClient(timeout=120) as client:

        async def one(prompt: list[int]) -> list[int]:
            body = {
                "prompt": prompt,
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "ignore_eos": True,
                "return_token_ids": True,
            }
            resp = await client.post(server.url_for("v1", "completions"), json=body)
            assert resp.status_code == 200, resp.text
            return resp.json()["choices"][0]["token_ids"]

        return list(await asyncio.gather(*(one(p) for p in prompts)))


def _successes_per_engine(server: RemoteOpenAIServer) -> dict[str, float]:
    """vllm:request_success_total summed per `engine` label."""
    text = httpx.get(server.url_for("metrics"), timeout=5).text
    per_engine: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:request_success_total{"):
            labels, value = line.rsplit(" ", 1)
            engine = labels.split('engine="', 1)[1].split('"', 1)[0]
            per_engine[engine] = per_engine.get(engine, 0.0) + float(value)
    return per_engine


def _engine_cpu_seconds(server: RemoteOpenAIServer) -> float:
    total = 0.0
    for proc in server.children():
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _check_greedy_and_waves(server: RemoteOpenAIServer, expected: list[list[int]]) -> None:
    # One request alone: the other engine joins every forward with a dummy batch.
    assert asyncio.run(_complete_all(server, PROMPTS[:1])) == expected[:1]
    # Concurrent requests of different lengths (the load balancer spreads them).
    assert asyncio.run(_complete_all(server, PROMPTS)) == expected
    # Both engines served some (per-engine metrics, label engine = DP rank).
    per_engine = _successes_per_engine(server)
    assert per_engine.keys() == {"0", "1"} and min(per_engine.values()) >= 1, per_engine
    # The wave ends (every 32 steps the engines agree nobody has work):
    # the engines stop stepping dummy batches and go idle.
    time.sleep(3)
    before = _engine_cpu_seconds(server)
    time.sleep(3)
    assert _engine_cpu_seconds(server) - before < 1.0
    # A new wave starts after the idle period.
    assert asyncio.run(_complete_all(server, PROMPTS[-1:])) == expected[-1:]


# Mixtral (experts split by tensor slices) is served by the fault test below,
# which checks the same before it kills an engine.
@pytest.mark.parametrize(
    "kind, extra",
    [("qwen2_moe", ["-ep"]), ("deepseek_v2", ["-ep"])],
    ids=["qwen2_moe-ep", "deepseek_v2-ep"],
)
def test_dp2_moe_greedy_equals_single_engine(tmp_path, kind, extra):
    model_dir = build_zoo_model(kind, str(tmp_path / kind))
    expected = hf_greedy(model_dir, PROMPTS, MAX_TOKENS)
    server = _start(model_dir, extra, str(tmp_path / "log"))
    try:
        children = server.children()
        _check_greedy_and_waves(server, expected)
    finally:
        code = server.stop()
    assert code == 0
    wait_exited(children, timeout=30)


async def _load_then_kill(server: RemoteOpenAIServer, victim: psutil.Process) -> list[int]:
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(i: int) -> int:
            # Short prompts, LOAD_TOKENS each: still running when the engine dies.
            body = {"prompt": PROMPTS[i % 5], "max_tokens": LOAD_TOKENS, "ignore_eos": True}
            try:
                resp = await client.post(server.url_for("v1", "completions"), json=body)
            except httpx.HTTPError:
                return -1  # the server went away mid-request: an error, not a hang
            return resp.status_code

        tasks = [asyncio.create_task(one(i)) for i in range(6)]
        await asyncio.sleep(0.5)
        victim.kill()
        return list(await asyncio.gather(*tasks))


def test_dp2_mixtral_greedy_then_engine_killed_under_load_fails_requests(tmp_path):
    """Mixtral, experts split by tensor slices: greedy equals transformers and
    the waves go idle, as above. Then SIGKILL one of the two lock-stepped
    engines mid-load: its peer, inside an MoE collective, sees the gloo
    connection drop; every in-flight request (on either engine) ends with an
    error within seconds, /health turns 503 (kept alive to see it; by default
    the server exits, as upstream) and every process exits on shutdown."""
    model_dir = build_zoo_model("mixtral", str(tmp_path / "mixtral"))
    expected = hf_greedy(model_dir, PROMPTS, MAX_TOKENS)
    keep_alive = {"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"}
    server = _start(
        model_dir,
        ["-asc", "1"],
        str(tmp_path / "log"),
        env=keep_alive,
        max_model_len=512,
    )
    try:
        children = server.children()
        _check_greedy_and_waves(server, expected)
        cores = {p.name(): p for p in children if p.name().startswith("EngineCore_DP")}
        assert set(cores) == {"EngineCore_DP0", "EngineCore_DP1"}
        start = time.monotonic()
        codes = asyncio.run(_load_then_kill(server, cores["EngineCore_DP1"]))
        # 500: the engine-dead error; -1: the connection closed.
        assert all(code in (500, -1) for code in codes), codes
        assert time.monotonic() - start < 30
        assert httpx.get(server.url_for("health"), timeout=10).status_code == 503
    finally:
        server.stop()
    wait_exited(children, timeout=30)
