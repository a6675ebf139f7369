"""A forward pass that raises inside the engine core (upstream:
tests/v1/shutdown/test_forward_error.py, through the server): in-flight
requests end with an error, /health answers 503, no process is left."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.entrypoints.openai.conftest import RemoteOpenAIServer, default_server_args, wait_exited

LAUNCHER = [sys.executable, str(Path(__file__).with_name("raising_model_server.py"))]
# Late enough to get past start-up (warm-up passes) and into the requests.
RAISE_ON_CALL = 40
BODY = {
    "model": "tiny",
    "prompt": "The quick brown fox",
    "max_tokens": 300,
    "min_tokens": 300,
    "ignore_eos": True,
}


def _start(model_dir: str, template: str, keep_alive: bool) -> RemoteOpenAIServer:
    env = {
        "VLLM_TEST_RAISE_ON_FORWARD": str(RAISE_ON_CALL),
        "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1" if keep_alive else "0",
    }
    return RemoteOpenAIServer(
        model_dir,
        default_server_args(template) + ["--served-model-name", "tiny"],
        env=env,
        launcher=LAUNCHER,
    )


async def _in_flight(server: RemoteOpenAIServer) -> tuple[list[int], list[str]]:
    """Two plain and two streaming requests that the failure interrupts."""
    url = server.url_for("v1/completions")
    async with httpx.AsyncClient(timeout=60) as client:

        async def plain() -> int:
            return (await client.post(url, json=BODY)).status_code

        async def stream() -> str:
            async with client.stream("POST", url, json={**BODY, "stream": True}) as r:
                return [line async for line in r.aiter_lines() if line][-2]

        results = await asyncio.gather(plain(), plain(), stream(), stream())
    return list(results[:2]), list(results[2:])


def test_forward_error_keep_alive(tiny_model_dir, chat_template_file):
    server = _start(tiny_model_dir("llama"), chat_template_file, keep_alive=True)
    try:
        engines = server.engine_processes()
        assert engines
        statuses, last_frames = asyncio.run(_in_flight(server))
        assert statuses == [500, 500]
        # Streams: an error frame, then [DONE].
        assert all('"error"' in frame for frame in last_frames), last_frames
        assert httpx.get(server.url_for("health")).status_code == 503
        r = httpx.post(server.url_for("v1/completions"), json={**BODY, "max_tokens": 2})
        assert r.status_code == 500 and r.json()["error"]["code"] == 500
        wait_exited(engines)  # the engine core exited on its own
    finally:
        code = server.stop()
    assert code == 0


def test_forward_error_stops_server(tiny_model_dir, chat_template_file):
    """Without keep-alive the API server exits too, and leaves nothing behind."""
    server = _start(tiny_model_dir("llama"), chat_template_file, keep_alive=False)
    children = server.children()
    try:
        statuses, _ = asyncio.run(_in_flight(server))
        assert statuses == [500, 500]
        start = time.monotonic()
        server.proc.wait(timeout=15)
        assert time.monotonic() - start < 15
        wait_exited(children)
    finally:
        server.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url_for("health"))
