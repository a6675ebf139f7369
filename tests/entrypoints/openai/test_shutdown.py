"""Graceful shutdown with `--shutdown-timeout > 0` (upstream:
tests/entrypoints/openai/completion/test_shutdown.py): SIGTERM under load
stops accepting connections at once, lets every in-flight request run to its
normal end, then the server and all its children exit. (The zero-timeout case,
in-flight requests cut short, is test_serving.py's SIGTERM test.)"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time

import httpx
import pytest

from tests.entrypoints.openai.conftest import RemoteOpenAIServer, default_server_args, wait_exited

SHUTDOWN_TIMEOUT_S = 30
# Long enough to be mid-generation when the signal lands (the signal is sent
# once every stream has produced output); far below the shutdown timeout.
TOKENS = 120
NUM_STREAMS = 3
# The contract: the server and its children are gone this soon after the
# last in-flight request finished.
EXIT_WITHIN_S = 10.0


@pytest.fixture
def server(tiny_model_dir, chat_template_file):
    srv = RemoteOpenAIServer(
        tiny_model_dir("llama"),
        default_server_args(chat_template_file)
        + ["--served-model-name", "tiny", "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)],
    )
    yield srv
    srv.stop()


def _body(stream: bool) -> dict:
    body = {
        "model": "tiny",
        "prompt": "The quick brown fox",
        "max_tokens": TOKENS,
        "min_tokens": TOKENS,
        "ignore_eos": True,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def _stream(client: httpx.AsyncClient, url: str, started: asyncio.Event) -> list[dict]:
    chunks: list[dict] = []
    async with client.stream("POST", url, json=_body(stream=True)) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            started.set()
            chunks.append({"done": True} if line == "data: [DONE]" else json.loads(line[6:]))
    return chunks


async def _wait_running(server: RemoteOpenAIServer, num: int) -> None:
    deadline = time.monotonic() + 30
    while server.metrics()["vllm:num_requests_running"] < num:
        assert time.monotonic() < deadline, "requests never all running"
        await asyncio.sleep(0.05)


def _refuses_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except OSError:
        return True


async def _new_request_is_turned_away(server: RemoteOpenAIServer) -> None:
    """A request sent after SIGTERM: a connection error, or 503/500. One that
    got in before the listening socket closed is served; then try again."""
    # A new connection per attempt (no keep-alive): once the listening socket is
    # closed, the next attempt cannot get in. The bound is generous: on a loaded
    # 2-core machine a 1-token request waits behind the in-flight streams, and
    # uvicorn notices the signal on its next tick.
    deadline = time.monotonic() + 30
    no_reuse = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=30, limits=no_reuse) as fresh:
        while True:
            try:
                r = await fresh.post(
                    server.url_for("v1/completions"),
                    json={"model": "tiny", "prompt": "hi", "max_tokens": 1},
                )
            except httpx.TransportError:
                return
            if r.status_code in (500, 503):
                return
            assert r.status_code == 200, r.text
            assert time.monotonic() < deadline, "still accepting requests after SIGTERM"
            await asyncio.sleep(0.1)


def test_sigterm_lets_in_flight_requests_finish(server):
    children = server.children()
    assert children, "the engine core runs in a child process"
    url = server.url_for("v1/completions")

    async def run() -> tuple[list[list[dict]], dict, float]:
        async with httpx.AsyncClient(timeout=120) as client:
            whole = asyncio.create_task(client.post(url, json=_body(stream=False)))
            started = [asyncio.Event() for _ in range(NUM_STREAMS)]
            streams = [asyncio.create_task(_stream(client, url, event)) for event in started]
            for event in started:
                await asyncio.wait_for(event.wait(), 60)
            await _wait_running(server, NUM_STREAMS + 1)
            server.proc.send_signal(signal.SIGTERM)
            await _new_request_is_turned_away(server)
            assert _refuses_connections(server.port)
            results = await asyncio.gather(*streams)
            response = await whole
            finished_at = time.monotonic()
        assert response.status_code == 200, response.text
        return results, response.json(), finished_at

    results, whole, finished_at = asyncio.run(run())
    # Every in-flight request ran to its normal end, in full.
    assert whole["choices"][0]["finish_reason"] == "length"
    assert whole["usage"]["completion_tokens"] == TOKENS
    for chunks in results:
        assert chunks[-1] == {"done": True}
        reasons = [c["choices"][0]["finish_reason"] for c in chunks[:-1] if c["choices"]]
        assert [r for r in reasons if r] == ["length"]
        assert chunks[-2]["usage"]["completion_tokens"] == TOKENS
    # Then the server, and every child, exits (cleanly) soon after.
    server.proc.wait(timeout=max(finished_at + EXIT_WITHIN_S - time.monotonic(), 0.1))
    assert server.proc.returncode == 0
    wait_exited(children, timeout=max(finished_at + EXIT_WITHIN_S - time.monotonic(), 0.1))
