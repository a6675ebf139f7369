"""SIGKILL of the engine core under load (issue 13): streams decoding and
requests still waiting for a slot when the engine-core process dies. Every
client gets an error (an error frame in its stream, a 5xx with the error
envelope, or a closed connection; never a hang), /health answers 503, and no
process of the server's tree is left: the server exits on its own (the
launcher's watchdog), or with VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 stays up
answering errors until SIGTERM. (A clean SIGTERM under load is
test_shutdown.py's; the load itself is test_load.py's.)"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from tests.entrypoints.openai.conftest import RemoteOpenAIServer, default_server_args, wait_exited
from tests.entrypoints.openai.test_load import MODEL, Spec, request_body

KILL_STREAMS = 50
# Each far longer than the test: they can only end by the kill. (Prompt +
# tokens must fit in the server's max_model_len of 512.)
KILL_TOKENS = 400
# Every client hears of the engine's death this soon (the monitor thread
# sees the process exit at once; the clients' error frames follow).
KILL_CLIENT_DEADLINE_S = 15.0
# The server exits (launcher watchdog, or the first request that meets the
# dead engine) and every child is gone this soon after the kill.
KILL_EXIT_DEADLINE_S = 20.0
# The load (32 decoding, 18 waiting) builds up within this, even on a loaded
# machine.
LOAD_DEADLINE_S = 60.0


async def _doomed_stream(
    client: httpx.AsyncClient, base: str, index: int, firsts: list[int]
) -> str:
    """A stream that cannot end normally before the kill: how did it end?"""
    path, body = request_body(Spec(index, chat=index % 2 == 1, max_tokens=KILL_TOKENS))
    try:
        async with client.stream("POST", f"{base}/{path}", json=body) as r:
            if r.status_code != 200:
                error = json.loads(await r.aread())["error"]
                return f"status {r.status_code} {error['type']}"
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    frame = json.loads(line[6:])
                    if "error" in frame:
                        return f"error frame {frame['error']['type']}"
                    firsts[index] = 1
            return "ended without an error"
    except httpx.TransportError as e:
        return f"connection error {type(e).__name__}"


async def _wait_loaded(
    server: RemoteOpenAIServer, running: int, waiting: int, tasks: list[asyncio.Task]
) -> None:
    deadline = time.monotonic() + LOAD_DEADLINE_S
    while True:
        ended = [t.result() for t in tasks if t.done()]
        assert not ended, f"streams ended before the kill: {ended[:3]}"
        values = server.metrics()
        if (
            values["vllm:num_requests_running"] >= running
            and values["vllm:num_requests_waiting"] >= waiting
        ):
            return
        assert time.monotonic() < deadline, f"load never built up: {values}"
        await asyncio.sleep(0.1)


def _health(server: RemoteOpenAIServer) -> int | None:
    """/health's status, or None once nothing listens."""
    try:
        return httpx.get(server.url_for("health"), timeout=5).status_code
    except httpx.TransportError:
        return None


@pytest.mark.parametrize("keep_alive", [False, True], ids=["exits", "keep-alive"])
def test_engine_core_sigkill_under_load(tiny_model_dir, chat_template_file, keep_alive, tmp_path):
    """Some streams decoding, some still waiting for a slot: SIGKILL the engine
    core. Every client gets an error; /health is 503 until the server exits
    (on its own by default; with VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 it stays up,
    answering errors, until SIGTERM); then no process of the tree is left."""
    max_num_seqs = KILL_STREAMS - 18  # 18 requests wait in the queue
    env = {"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1" if keep_alive else "0"}
    server = RemoteOpenAIServer(
        tiny_model_dir("llama"),
        default_server_args(chat_template_file)
        + ["--served-model-name", MODEL, "--max-num-seqs", str(max_num_seqs)],
        env=env,
        log_path=str(tmp_path / "server.log"),
    )
    try:
        tree = [server.ps, *server.children()]
        engines = server.engine_processes()
        assert len(engines) == 1, engines
        base = server.url_for("")[:-1]

        async def run() -> tuple[list[str], float]:
            firsts = [0] * KILL_STREAMS
            limits = httpx.Limits(max_connections=KILL_STREAMS + 8)
            async with httpx.AsyncClient(timeout=LOAD_DEADLINE_S, limits=limits) as client:
                tasks = [
                    asyncio.create_task(_doomed_stream(client, base, i, firsts))
                    for i in range(KILL_STREAMS)
                ]
                await _wait_loaded(server, max_num_seqs, KILL_STREAMS - max_num_seqs, tasks)
                engines[0].kill()
                killed_at = time.monotonic()
                done, pending = await asyncio.wait(tasks, timeout=KILL_CLIENT_DEADLINE_S)
                for task in pending:
                    task.cancel()
                ends = [t.result() if t in done else "no answer (hang)" for t in tasks]
            assert sum(firsts) >= max_num_seqs  # they were decoding when it died
            return ends, killed_at

        ends, killed_at = asyncio.run(run())
        print("\n" + "; ".join(f"{e}: {ends.count(e)}" for e in sorted(set(ends))))
        # The death is logged with its cause once, not with a traceback per
        # request in flight (there are KILL_STREAMS of them).
        log = (tmp_path / "server.log").read_text(errors="replace")
        assert "Engine core is dead" in log
        assert log.count("Traceback") <= 2, log.count("Traceback")
        ok = ("status 5", "error frame", "connection error")
        assert all(e.startswith(ok) for e in ends), ends
        health = _health(server)
        assert health in (503, None), health
        if keep_alive:
            assert health == 503
            r = httpx.post(
                server.url_for("v1/completions"),
                timeout=10,
                json={"model": MODEL, "prompt": "hi", "max_tokens": 2},
            )
            assert r.status_code >= 500 and r.json()["error"]["message"], r.text
            assert server.proc.poll() is None  # still up
            killed_at = time.monotonic()  # the deadline below now runs from SIGTERM
            server.stop()
        else:
            server.proc.wait(max(killed_at + KILL_EXIT_DEADLINE_S - time.monotonic(), 0.1))
        wait_exited(tree, timeout=max(killed_at + KILL_EXIT_DEADLINE_S - time.monotonic(), 1.0))
    finally:
        server.stop()
