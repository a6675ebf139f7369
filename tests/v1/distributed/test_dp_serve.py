"""`vllm serve -dp 2` on a tiny dense float32 model: two engine cores behind
one API server and the DP coordinator (a real server subprocess).

Shows: greedy outputs equal transformers' (the single-engine reference);
requests spread over both engines (the `engine` label on /metrics); load
balancing (one engine busy with a long request, short ones go to the other:
measured waits); SIGKILL of one engine fails the requests in flight with an
error (no hang), /health turns 503, and every process exits on shutdown.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import psutil
import pytest

from tests.entrypoints.openai.conftest import RemoteOpenAIServer
from tests.utils import hf_greedy, make_tiny_model

LONG_TOKENS = 4000
START_TIMEOUT_S = 420
PROMPTS = [[1, 5, 9, 13], [2, 4, 6], [7, 7, 8, 9, 10], [3], [11, 12], [20, 21, 22, 23, 24, 25]]
SERVE_ARGS = [
    "--max-model-len",
    "4096",
    "--dtype",
    "float32",
    "--kv-cache-memory-bytes",
    "16000000",
    "--api-server-count",
    "1",
    "-dp",
    "2",
]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    """The tiny llama with a long context, so that one request can keep an
    engine busy for a while."""
    return make_tiny_model(
        "llama", str(tmp_path_factory.mktemp("dp-llama")), max_position_embeddings=4096
    )


def start_server(model: str, env: dict[str, str] | None = None) -> RemoteOpenAIServer:
    """Two engines load on the same cores: allow a loaded machine more time."""
    srv = RemoteOpenAIServer(model, SERVE_ARGS, env=env, wait=False)
    try:
        srv.wait_until_healthy(timeout=START_TIMEOUT_S)
    except BaseException:
        srv.stop()
        raise
    return srv


@pytest.fixture(scope="module")
def server(model):
    srv = start_server(model)
    try:
        yield srv
    finally:
        srv.stop()


def engine_metric(srv: RemoteOpenAIServer, name: str, **labels: str) -> dict[str, float]:
    """engine label -> value of `name` (summed over the other labels)."""
    text = httpx.get(srv.url_for("metrics"), timeout=10).text
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        label_text, value = line[len(name) + 1 :].rsplit("} ", 1)
        parsed = dict(part.split("=", 1) for part in label_text.split(","))
        parsed = {k: v.strip('"') for k, v in parsed.items()}
        if all(parsed.get(k) == v for k, v in labels.items()):
            engine = parsed["engine"]
            values[engine] = values.get(engine, 0.0) + float(value)
    return values


async def complete(client: httpx.AsyncClient, srv, model, prompt, max_tokens, **extra):
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    response = await client.post(srv.url_for("v1/completions"), json={**body, **extra})
    return response


def test_dp2_greedy_equals_single_engine_and_spreads(server, model):
    expected = hf_greedy(model, PROMPTS, 8)
    before = engine_metric(server, "vllm:request_success_total")

    async def run():
        async with httpx.AsyncClient(timeout=120) as client:
            responses = await asyncio.gather(
                *[
                    complete(client, server, model, p, 8, ignore_eos=True, return_token_ids=True)
                    for p in PROMPTS
                ]
            )
        return [r.json() for r in responses]

    bodies = asyncio.run(run())
    got = [b["choices"][0]["token_ids"] for b in bodies]
    assert got == expected
    after = engine_metric(server, "vllm:request_success_total")
    served = {e: after.get(e, 0) - before.get(e, 0) for e in ("0", "1")}
    assert sum(served.values()) == len(PROMPTS)
    assert served["0"] > 0 and served["1"] > 0, served


def test_short_requests_avoid_the_busy_engine(server, model):
    """A long request keeps one engine busy; short requests sent meanwhile all
    go to the other engine and wait no longer than on an idle server."""

    async def run():
        async with httpx.AsyncClient(timeout=300) as client:
            # Baseline: short-request latency with both engines idle.
            idle = []
            for p in PROMPTS[:3]:
                t0 = time.monotonic()
                assert (await complete(client, server, model, p, 4)).status_code == 200
                idle.append(time.monotonic() - t0)
            before = engine_metric(server, "vllm:request_success_total")
            long_task = asyncio.create_task(
                complete(client, server, model, [1, 2, 3], LONG_TOKENS, ignore_eos=True)
            )
            busy = await _wait_for_busy_engine(server)
            short = []
            for p in PROMPTS:
                # New requests arrive after the coordinator's next stats update
                # (every 100 ms while counts change): until then the balancer
                # also counts the previous short request against its engine.
                await asyncio.sleep(0.3)
                t0 = time.monotonic()
                assert (await complete(client, server, model, p, 4)).status_code == 200
                short.append(time.monotonic() - t0)
            mid = engine_metric(server, "vllm:request_success_total")
            assert not long_task.done(), "the long request finished before the short ones"
            t_long = time.monotonic()
            assert (await long_task).status_code == 200
            return idle, short, busy, before, mid, t_long

    idle, short, busy, before, mid, _ = asyncio.run(run())
    other = "1" if busy == "0" else "0"
    assert mid.get(busy, 0) - before.get(busy, 0) == 0  # the busy engine served none
    assert mid.get(other, 0) - before.get(other, 0) == len(PROMPTS)
    print(f"idle waits {idle}, short waits while engine {busy} busy {short}")
    # Not queued behind the long request: within a few idle latencies.
    assert max(short) < 5 * max(idle) + 1.0


async def _wait_for_busy_engine(srv, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = engine_metric(srv, "vllm:num_requests_running")
        busy = [e for e, v in running.items() if v > 0]
        if busy:
            return busy[0]
        await asyncio.sleep(0.1)
    raise AssertionError("no engine reported the long request running")


def test_sigkill_one_engine_fails_requests_and_health(model):
    """SIGKILL one DP engine under load: every request in flight ends (an
    error, no hang), /health turns 503, and shutdown leaves no process.
    (Keep-alive: by default the server exits on engine death, as upstream.)"""
    srv = start_server(model, env={"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"})
    try:
        procs = srv.children()
        engines = {p.name(): p for p in procs if p.name().startswith("EngineCore_DP")}
        assert set(engines) == {"EngineCore_DP0", "EngineCore_DP1"}
        assert any(p.name() == "DPCoordinator" for p in procs)

        async def run():
            async with httpx.AsyncClient(timeout=120) as client:
                tasks = [
                    asyncio.create_task(complete(client, srv, model, p, 200, ignore_eos=True))
                    for p in PROMPTS
                ]
                await _wait_for_busy_engine(srv)
                os.kill(engines["EngineCore_DP1"].pid, signal.SIGKILL)
                t0 = time.monotonic()
                results = await asyncio.gather(*tasks, return_exceptions=True)
                return results, time.monotonic() - t0

        results, waited = asyncio.run(run())
        assert waited < 60
        statuses = [r.status_code for r in results if isinstance(r, httpx.Response)]
        assert any(code >= 500 for code in statuses), statuses
        assert httpx.get(srv.url_for("health"), timeout=10).status_code == 503
    finally:
        srv.stop()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(
        p.is_running() and p.status() != "zombie" for p in procs
    ):
        time.sleep(0.5)
    left = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, left


def test_abort_goes_to_the_engine_that_runs_the_request(server, model):
    """A streamed request whose client disconnects is aborted on the engine
    the balancer chose (the request -> engine map): both engines are idle
    again long before its 4000 tokens would be done."""

    async def run():
        async with httpx.AsyncClient(timeout=120) as client:
            body = {
                "model": model,
                "prompt": [4, 5, 6],
                "max_tokens": LONG_TOKENS,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
            }
            async with client.stream("POST", server.url_for("v1/completions"), json=body) as r:
                chunks = 0
                async for _ in r.aiter_lines():
                    chunks += 1
                    if chunks >= 5:
                        break
                busy = await _wait_for_busy_engine(server)
            # The stream is closed: the server aborts the request.
            t0 = time.monotonic()
            while time.monotonic() - t0 < 30:
                running = engine_metric(server, "vllm:num_requests_running")
                if not any(running.values()):
                    return busy, time.monotonic() - t0
                await asyncio.sleep(0.2)
            raise AssertionError(f"engine {busy} still runs the aborted request: {running}")

    busy, idle_after = asyncio.run(run())
    # An abort sent to the wrong engine would leave the request running there
    # until its 4000 tokens are done (seconds even for this tiny model).
    assert idle_after < 3.0, (busy, idle_after)
