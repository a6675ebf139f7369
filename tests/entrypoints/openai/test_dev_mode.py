"""The operator routes under VLLM_SERVER_DEV_MODE=1 against a real `vllm serve`
(upstream: tests/entrypoints/openai/test_sleep.py and the dev-mode routes):
/sleep, /wake_up, /is_sleeping, /reset_prefix_cache, /collective_rpc.

Memory is measured as the resident set of the engine-core process. The
server runs with MALLOC_MMAP_THRESHOLD_=1 MiB so that glibc serves every
tensor-sized allocation with its own mapping and returns it to the OS on free:
the RSS then shows whether the engine dropped its last reference to the
weights, not the allocator's caching policy. The CPU KV cache is anonymous
memory mapped at start-up and faulted in as it fills (only the pages requests
touched are resident), so its release shows as the mapping going away: the
process's virtual size (VMS) drops by the cache's size.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.entrypoints.openai.conftest import RemoteOpenAIServer, default_server_args
from tests.utils import make_tiny_model

API_KEY = "dev-mode-key"
KV_BYTES = 256 * 2**20
MiB = 2**20
DEV_ROUTES = [
    ("POST", "/sleep"),
    ("POST", "/wake_up"),
    ("GET", "/is_sleeping"),
    ("POST", "/reset_prefix_cache"),
    ("POST", "/collective_rpc"),
]
PROMPTS = ["The quick brown fox", "def hello(world):"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    # Wider MLPs than the shared tiny model (about 24 MiB of weights in 4 MiB
    # tensors), so that level 2's release of the weights is measurable.
    return make_tiny_model(
        "llama", str(tmp_path_factory.mktemp("tiny-wide")), intermediate_size=16384
    )


@pytest.fixture(scope="module")
def server(model_dir, chat_template_file):
    args = default_server_args(chat_template_file) + [
        "--kv-cache-memory-bytes",
        str(KV_BYTES),
        "--enable-sleep-mode",
        "--api-key",
        API_KEY,
    ]
    env = {"VLLM_SERVER_DEV_MODE": "1", "MALLOC_MMAP_THRESHOLD_": str(MiB)}
    srv = RemoteOpenAIServer(model_dir, args, env=env, api_key=API_KEY)
    yield srv
    srv.stop()


def _post(server: RemoteOpenAIServer, path: str, **params) -> httpx.Response:
    return httpx.post(
        server.url_for(path.lstrip("/")), params=params, headers=server.headers(), timeout=120
    )


def _is_sleeping(server: RemoteOpenAIServer) -> bool:
    r = httpx.get(server.url_for("is_sleeping"), headers=server.headers(), timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["is_sleeping"]


def _engine_rss(server: RemoteOpenAIServer) -> int:
    procs = server.engine_processes()
    assert procs, "no engine-core process"
    return sum(p.memory_info().rss for p in procs)


def _engine_vms(server: RemoteOpenAIServer) -> int:
    return sum(p.memory_info().vms for p in server.engine_processes())


def _greedy(server: RemoteOpenAIServer, max_tokens: int = 8) -> list[str]:
    client = server.get_client()
    out = client.completions.create(
        model=server_model(server), prompt=PROMPTS, max_tokens=max_tokens, temperature=0
    )
    return [c.text for c in sorted(out.choices, key=lambda c: c.index)]


def server_model(server: RemoteOpenAIServer) -> str:
    return server.get_client().models.list().data[0].id


def _assert_envelope(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == status and error["message"]
    return error


# ---- routes and their guard ------------------------------------------------------
def test_routes_absent_without_dev_mode(monkeypatch):
    """Without VLLM_SERVER_DEV_MODE the routes are not registered at all."""
    from vllm.entrypoints.openai.api_server import build_app
    from vllm.entrypoints.openai.cli_args import make_arg_parser

    monkeypatch.delenv("VLLM_SERVER_DEV_MODE", raising=False)
    args = make_arg_parser(argparse.ArgumentParser()).parse_args([])
    client = TestClient(build_app(args))
    paths = client.get("/openapi.json").json()["paths"]
    for method, path in DEV_ROUTES:
        assert path not in paths
        assert client.request(method, path).status_code == 404


def test_routes_need_the_api_key(server):
    for method, path in DEV_ROUTES:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = httpx.request(method, server.url_for(path.lstrip("/")), headers=headers, timeout=30)
            assert r.status_code == 401, (method, path, r.text)
    assert _is_sleeping(server) is False  # nothing above reached the engine
    assert "/sleep" in httpx.get(server.url_for("openapi.json"), timeout=30).json()["paths"]


def test_collective_rpc_is_refused(server):
    error = _assert_envelope(_post(server, "/collective_rpc"), 400)
    assert "not built" in error["message"]


@pytest.mark.parametrize(
    "path,params,needle",
    [
        ("/sleep", {"level": 3}, "level"),
        ("/sleep", {"level": "one"}, "level"),
        ("/sleep", {"level": -1}, "level"),
        ("/sleep", {"level": 1, "mode": "bogus"}, "mode"),
        ("/wake_up", {"tags": "bogus"}, "tags"),
        ("/reset_prefix_cache", {"reset_external": "true"}, "connector"),
        ("/reset_prefix_cache", {"reset_running_requests": "maybe"}, "reset_running_requests"),
    ],
)
def test_bad_arguments_are_400(server, path, params, needle):
    error = _assert_envelope(_post(server, path, **params), 400)
    assert needle in error["message"]
    assert _is_sleeping(server) is False


# ---- sleep / wake_up -------------------------------------------------------------
def _sleep_and_measure(
    server: RemoteOpenAIServer, level: int, size=_engine_rss
) -> tuple[int, int, int]:
    """`size` (RSS by default) before, while asleep, after waking up."""
    before = size(server)
    assert _post(server, "/sleep", level=level).status_code == 200
    assert _is_sleeping(server) is True
    asleep = size(server)
    r = _post(server, "/wake_up")
    assert r.status_code == 200, r.text
    assert _is_sleeping(server) is False
    return before, asleep, size(server)


def test_sleep_frees_memory_and_outputs_survive(server, model_dir):
    reference = _greedy(server)
    weight_bytes = os.path.getsize(os.path.join(model_dir, "model.safetensors"))
    before, asleep, after = _sleep_and_measure(server, level=1, size=_engine_vms)
    drop1 = before - asleep
    print(f"level 1 (VMS): {before / MiB:.0f} -> {asleep / MiB:.0f} -> {after / MiB:.0f} MiB")
    assert drop1 >= 0.9 * KV_BYTES, f"level 1 unmapped {drop1 / MiB:.0f} MiB"
    assert abs(after - before) < 0.1 * KV_BYTES
    assert _greedy(server) == reference

    # Level 2 also drops the weights (resident: loaded and packed at start-up).
    before, asleep, after = _sleep_and_measure(server, level=2)
    drop2 = before - asleep
    print(
        f"level 2: {before / MiB:.0f} -> {asleep / MiB:.0f} -> {after / MiB:.0f} MiB "
        f"(weights {weight_bytes / MiB:.0f} MiB)"
    )
    assert drop2 >= 0.7 * weight_bytes, (drop2, weight_bytes)
    assert abs(after - before) < 0.1 * KV_BYTES
    assert _greedy(server) == reference


def test_wake_up_by_tags(server):
    reference = _greedy(server)
    assert _post(server, "/sleep", level=2).status_code == 200
    assert _post(server, "/wake_up", tags="weights").status_code == 200
    assert _is_sleeping(server) is True  # the KV cache is still asleep
    assert _post(server, "/wake_up", tags="kv_cache").status_code == 200
    assert _is_sleeping(server) is False
    assert _greedy(server) == reference
    # Level 0 pauses scheduling only; the "scheduling" tag resumes it.
    assert _post(server, "/sleep", level=0).status_code == 200
    assert _is_sleeping(server) is True
    assert _post(server, "/wake_up", tags="scheduling").status_code == 200
    assert _greedy(server) == reference


def test_request_while_asleep_waits_for_wake_up(server):
    """As upstream: accepted, queued until /wake_up, then served."""
    reference = _greedy(server)
    assert _post(server, "/sleep", level=1).status_code == 200
    result: dict[str, list[str]] = {}
    thread = threading.Thread(target=lambda: result.setdefault("out", _greedy(server)))
    thread.start()
    thread.join(timeout=3)
    assert thread.is_alive(), "a request was served while the engine slept"
    assert _post(server, "/wake_up").status_code == 200
    thread.join(timeout=60)
    assert result["out"] == reference


def test_sleep_aborts_requests_in_flight(server):
    client = server.get_client()
    stream = client.completions.create(
        model=server_model(server),
        prompt="Hello",
        max_tokens=400,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    next(iter(stream))  # the request is running
    assert _post(server, "/sleep", level=1).status_code == 200
    reasons = [c.choices[0].finish_reason for c in stream if c.choices]
    assert reasons and reasons[-1] == "abort"
    assert _post(server, "/wake_up").status_code == 200
    assert len(_greedy(server)) == len(PROMPTS)


def test_sleep_mode_wait_lets_requests_in_flight_finish(server):
    """Mode "wait": the running request completes; one sent meanwhile is held
    until /wake_up; /sleep answers once the engine is asleep."""
    reference = _greedy(server)
    stream = server.get_client().completions.create(
        model=server_model(server),
        prompt="Hello",
        max_tokens=64,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = iter(stream)
    next(chunks)  # the request is running
    result: dict = {}
    sleeper = threading.Thread(
        target=lambda: result.setdefault("sleep", _post(server, "/sleep", level=1, mode="wait"))
    )
    sleeper.start()
    deadline = time.monotonic() + 30
    while not _is_sleeping(server):  # the sleep is pending in the core
        assert time.monotonic() < deadline
        time.sleep(0.05)
    late = threading.Thread(target=lambda: result.setdefault("late", _greedy(server)))
    late.start()
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == "length"
    sleeper.join(timeout=60)
    assert result["sleep"].status_code == 200, result["sleep"].text
    late.join(timeout=2)
    assert late.is_alive(), "a request sent during a 'wait' sleep was served"
    assert _post(server, "/wake_up").status_code == 200
    late.join(timeout=60)
    assert result["late"] == reference


def test_sleep_mode_keep_resumes_requests_in_flight(server):
    """Mode "keep": the running request is preempted, and after /wake_up it
    completes with the text an uninterrupted run gives."""
    kwargs = dict(
        model=server_model(server),
        prompt="Hello",
        max_tokens=48,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    client = server.get_client()
    reference = client.completions.create(**kwargs).choices[0].text
    chunks = iter(client.completions.create(stream=True, **kwargs))
    text = next(chunks).choices[0].text
    assert _post(server, "/sleep", level=1, mode="keep").status_code == 200
    assert _is_sleeping(server) is True
    assert _post(server, "/wake_up").status_code == 200
    finish = None
    for chunk in chunks:
        text += chunk.choices[0].text
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "length" and text == reference


def test_reset_with_running_requests_preempts_them(server):
    """reset_running_requests=true: the running request is preempted (the
    workers are told) and completes as if nothing happened."""
    kwargs = dict(
        model=server_model(server),
        prompt="Hello",
        max_tokens=48,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    client = server.get_client()
    reference = client.completions.create(**kwargs).choices[0].text
    chunks = iter(client.completions.create(stream=True, **kwargs))
    text = next(chunks).choices[0].text
    r = _post(server, "/reset_prefix_cache", reset_running_requests="true")
    assert r.status_code == 200, r.text
    text += "".join(chunk.choices[0].text for chunk in chunks)
    assert text == reference


def test_reset_prefix_cache(server):
    """After a reset a repeated prompt no longer hits the prefix cache."""
    client = server.get_client()
    prompt = "Paged attention stores keys and values in fixed-size blocks. " * 4

    def hits_of_one_request() -> float:
        start = server.metrics().get("vllm:prefix_cache_hits_total", 0.0)
        client.completions.create(model=server_model(server), prompt=prompt, max_tokens=1)
        # Stats reach /metrics with the engine's outputs; give them a moment.
        time.sleep(0.5)
        return server.metrics().get("vllm:prefix_cache_hits_total", 0.0) - start

    hits_of_one_request()
    assert hits_of_one_request() > 0  # the second request hits the cache
    assert _post(server, "/reset_prefix_cache").status_code == 200
    assert hits_of_one_request() == 0
