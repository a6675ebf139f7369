"""`vllm serve --api-server-count N` (issue 20 item 4; upstream:
vllm/entrypoints/cli/serve.py run_multi_api_server): N API server processes
share the port, each one client of the engine core(s).

Which server answered a request is read off the kernel, not the server: each
request goes on a connection of its own, the client notes its local port, and
while every connection is still open (HTTP keep-alive) the test lists the
ESTABLISHED sockets on the server port that each API server process holds
(psutil). A connection is owned by the process that accepted it, and that
process answers every request on it.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx
import psutil
import pytest

from tests.entrypoints.openai.conftest import RemoteOpenAIServer, default_server_args, wait_exited
from tests.utils import hf_greedy

API_KEY = "asc-test-key"
NUM_SERVERS = 2
NUM_REQUESTS = 64
MAX_TOKENS = 12
# Distinct prompts (token ids); request i uses PROMPTS[i % len(PROMPTS)].
PROMPTS = [[1 + (7 * i + j) % 200 for j in range(5 + i % 4)] for i in range(8)]
# Connections stay open this long after their response, so that the test can
# see which process holds each one (uvicorn's keep-alive timeout).
KEEP_ALIVE_S = 120
# Bound on the load round (64 x 12 tokens of a tiny model; ~5 s idle).
ROUND_DEADLINE_S = 120.0
# Every process is gone this soon after the parent is told to stop, or after
# one of its processes died.
EXIT_WITHIN_S = 30.0


def _server_args(chat_template_file: str, count: int = NUM_SERVERS) -> list[str]:
    return default_server_args(chat_template_file) + [
        "--served-model-name",
        "tiny",
        "--api-server-count",
        str(count),
        "--api-key",
        API_KEY,
    ]


def _start(model: str, chat_template_file: str) -> RemoteOpenAIServer:
    return RemoteOpenAIServer(
        model,
        _server_args(chat_template_file),
        env={"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": str(KEEP_ALIVE_S)},
        api_key=API_KEY,
    )


@pytest.fixture(scope="module")
def server(tiny_model_dir, chat_template_file):
    srv = _start(tiny_model_dir("llama"), chat_template_file)
    yield srv
    srv.stop()


def api_server_pids(srv: RemoteOpenAIServer) -> list[int]:
    """The children that listen on the server port: the API servers (the
    engine cores never hold that socket)."""
    pids = []
    for proc in srv.children():
        try:
            conns = proc.net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr.port == srv.port for c in conns):
            pids.append(proc.pid)
    return sorted(pids)


def connection_owners(srv: RemoteOpenAIServer) -> dict[int, int]:
    """Client port -> pid of the API server holding that open connection."""
    owners: dict[int, int] = {}
    for pid in api_server_pids(srv):
        for c in psutil.Process(pid).net_connections(kind="tcp"):
            if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == srv.port and c.raddr:
                assert c.raddr.port not in owners, "one connection held by two processes"
                owners[c.raddr.port] = pid
    return owners


@dataclass
class Answer:
    status: int
    text: str
    client_port: int

    @property
    def body(self) -> dict:
        return json.loads(self.text)


async def _on_fresh_connections(
    srv: RemoteOpenAIServer, n: int, path: str, body_of, headers: dict[str, str]
) -> tuple[list[Answer], dict[int, int]]:
    """`n` POSTs (GET when body_of is None), each on a connection of its own,
    started 10 ms apart; once all are answered (connections still open), which
    process holds each connection. Returns (answers, client port -> pid)."""
    clients = [httpx.AsyncClient(timeout=ROUND_DEADLINE_S) for _ in range(n)]

    async def one(i: int) -> Answer:
        await asyncio.sleep(0.01 * i)
        url = srv.url_for(path)
        if body_of is None:
            r = await clients[i].get(url, headers=headers)
        else:
            r = await clients[i].post(url, json=body_of(i), headers=headers)
        stream = r.extensions["network_stream"]
        port = stream.get_extra_info("client_addr")[1]
        return Answer(r.status_code, r.text, port)

    try:
        answers = await asyncio.wait_for(
            asyncio.gather(*(one(i) for i in range(n))), ROUND_DEADLINE_S
        )
        owners = connection_owners(srv)
    finally:
        for client in clients:
            await client.aclose()
    return list(answers), owners


def _completion(i: int) -> dict:
    return {
        "model": "tiny",
        "prompt": PROMPTS[i % len(PROMPTS)],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 1,
        "return_tokens_as_token_ids": True,
    }


def _generated_ids(body: dict) -> list[int]:
    tokens = body["choices"][0]["logprobs"]["tokens"]
    return [int(t.removeprefix("token_id:")) for t in tokens]


def test_both_servers_answer_a_concurrent_load(server, tiny_model_dir):
    pids = api_server_pids(server)
    assert len(pids) == NUM_SERVERS, pids
    auth = {"Authorization": f"Bearer {API_KEY}"}
    t0 = time.monotonic()
    answers, owners = asyncio.run(
        _on_fresh_connections(server, NUM_REQUESTS, "v1/completions", _completion, auth)
    )
    elapsed = time.monotonic() - t0
    # Nothing lost: every request answered in full.
    assert [a.status for a in answers] == [200] * NUM_REQUESTS
    assert all(a.body["usage"]["completion_tokens"] == MAX_TOKENS for a in answers)
    # Each answer came from one of the API servers, and both answered.
    served_by = [owners.get(a.client_port) for a in answers]
    assert None not in served_by, "an answered request's connection is not held by an API server"
    per_server = {pid: served_by.count(pid) for pid in pids}
    print(f"{NUM_REQUESTS} requests in {elapsed:.1f} s; per API server: {per_server}")
    assert all(count > 0 for count in per_server.values()), per_server
    # Greedy outputs equal transformers' (the single-engine reference).
    expected = hf_greedy(tiny_model_dir("llama"), PROMPTS, MAX_TOKENS)
    for i, answer in enumerate(answers):
        assert _generated_ids(answer.body) == expected[i % len(PROMPTS)], i


def test_every_server_checks_the_api_key(server):
    answers, owners = asyncio.run(
        _on_fresh_connections(server, 32, "v1/completions", _completion, {})
    )
    assert [a.status for a in answers] == [401] * 32
    served_by = {owners.get(a.client_port) for a in answers}
    assert served_by == set(api_server_pids(server)), served_by


def test_metrics_sum_over_the_servers(server):
    """/metrics from any server counts every server's requests (prometheus
    multiprocess mode): ask on fresh connections until both have answered."""
    auth = {"Authorization": f"Bearer {API_KEY}"}
    before = server.metrics()["vllm:request_success_total"]
    answers, owners = asyncio.run(
        _on_fresh_connections(server, 8, "v1/completions", _completion, auth)
    )
    assert [a.status for a in answers] == [200] * 8
    assert len({owners[a.client_port] for a in answers}) == NUM_SERVERS
    totals_by_server: dict[int, set[float]] = {}
    for _ in range(10):
        metrics, owners = asyncio.run(_on_fresh_connections(server, 6, "metrics", None, auth))
        for m in metrics:
            total = _sample(m, "vllm:request_success_total")
            totals_by_server.setdefault(owners[m.client_port], set()).add(total)
        if len(totals_by_server) == NUM_SERVERS:
            break
    assert len(totals_by_server) == NUM_SERVERS, totals_by_server
    for totals in totals_by_server.values():
        assert totals == {before + 8}, totals_by_server


def _sample(answer: Answer, name: str) -> float:
    """A sample of the /metrics text, summed over its label sets."""
    assert answer.status == 200, answer.text[:500]
    total = 0.0
    for line in answer.text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _per_engine(answer: Answer, name: str) -> dict[str, float]:
    """engine label -> a /metrics sample summed over its other labels."""
    values: dict[str, float] = {}
    for line in answer.text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1 :].rsplit("} ", 1)
            engine = dict(part.split("=", 1) for part in labels.split(","))["engine"].strip('"')
            values[engine] = values.get(engine, 0.0) + float(value)
    return values


def test_dp2_defaults_to_two_api_servers_then_one_is_killed(tiny_model_dir, chat_template_file):
    """`-dp 2` alone: upstream's default of one API server per engine; both
    servers answer, both engines serve, greedy outputs as one engine's. Then
    SIGKILL one API server: the parent stops every other process and exits
    with an error, as upstream (the engine-core and parent victims below)."""
    model = tiny_model_dir("llama")
    args = default_server_args(chat_template_file)
    args += ["--served-model-name", "tiny", "-dp", "2", "--api-key", API_KEY]
    srv = RemoteOpenAIServer(
        model, args, env={"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": str(KEEP_ALIVE_S)}, api_key=API_KEY
    )
    try:
        pids = api_server_pids(srv)
        assert len(pids) == 2, pids
        auth = {"Authorization": f"Bearer {API_KEY}"}
        n = 32
        answers, owners = asyncio.run(
            _on_fresh_connections(srv, n, "v1/completions", _completion, auth)
        )
        assert [a.status for a in answers] == [200] * n
        assert {owners[a.client_port] for a in answers} == set(pids)
        expected = hf_greedy(model, PROMPTS, MAX_TOKENS)
        for i, answer in enumerate(answers):
            assert _generated_ids(answer.body) == expected[i % len(PROMPTS)], i
        (metrics,), _ = asyncio.run(_on_fresh_connections(srv, 1, "metrics", None, auth))
        per_engine = _per_engine(metrics, "vllm:request_success_total")
        print("requests per engine:", per_engine)
        assert set(per_engine) == {"0", "1"} and all(v > 0 for v in per_engine.values())
        assert sum(per_engine.values()) == n
        _kill_and_expect_all_gone(srv, pids[-1])
    finally:
        srv.stop()


def _kill_and_expect_all_gone(srv: RemoteOpenAIServer, victim: int) -> None:
    children = srv.children()
    psutil.Process(victim).send_signal(signal.SIGKILL)
    srv.proc.wait(EXIT_WITHIN_S)
    assert srv.proc.returncode != 0
    wait_exited(children, timeout=EXIT_WITHIN_S)


def test_servers_and_engine_run_in_pre_started_interpreters(server):
    """The API servers and the engine core are the interpreters `vllm serve`
    pre-started (vllm/utils/warm_spawn.py), not cold spawns: the servers'
    ones since the config was valid, the engine's despite the
    PROMETHEUS_MULTIPROC_DIR set after it was started."""
    servers = api_server_pids(server)
    engines = [p for p in server.engine_processes() if p.pid not in servers]
    assert len(servers) == NUM_SERVERS and engines
    for proc in [psutil.Process(pid) for pid in servers] + engines:
        assert "warm_spawn import _child_main" in " ".join(proc.cmdline()), proc.cmdline()


def test_sigterm_stops_every_process(server):
    children = server.children()
    assert len(children) >= NUM_SERVERS + 1
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(EXIT_WITHIN_S)
    assert server.proc.returncode == 0
    wait_exited(children, timeout=EXIT_WITHIN_S)


@pytest.mark.parametrize("victim", ["engine_core", "parent"])
def test_a_dead_process_stops_them_all(victim, tiny_model_dir, chat_template_file):
    """SIGKILL the engine core: the parent stops every other process and
    exits with an error, as upstream (an API server as the victim: the -dp 2
    test above). SIGKILL the parent: its children see their death pipe close
    and exit too."""
    srv = _start(tiny_model_dir("llama"), chat_template_file)
    try:
        servers = api_server_pids(srv)
        assert len(servers) == NUM_SERVERS
        if victim == "parent":
            target = srv.proc.pid
        else:
            target = next(p.pid for p in srv.engine_processes() if p.pid not in servers)
        _kill_and_expect_all_gone(srv, target)
    finally:
        srv.stop()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--api-server-count", "0"], "--api-server-count must be at least 1"),
        (["-asc", "-2"], "--api-server-count must be at least 1"),
        (["--headless", "--api-server-count", "2"], "cannot be used with --headless"),
    ],
)
def test_bad_counts_are_refused_at_once(flags, message, tiny_model_dir):
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", tiny_model_dir("llama")]
        + flags,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr[-2000:]
    assert time.monotonic() - t0 < 60


def test_offline_api_refuses_api_server_count(tiny_model_dir):
    from vllm import LLM

    with pytest.raises(TypeError, match="api_server_count"):
        LLM(model=tiny_model_dir("llama"), api_server_count=2)
