"""`--api-key` guards every route but the published allow-list, whatever the
spelling of the path; `--max-num-queued-reqs` answers 503 with Retry-After."""

from __future__ import annotations

import asyncio
import socket

import httpx
import openai
import pytest

from tests.entrypoints.openai.conftest import RemoteOpenAIServer, default_server_args
from vllm.entrypoints.openai.api_server import UNGUARDED_PATHS

KEYS = ("sk-first", "sk-second")
BODY = {"model": "tiny", "prompt": "hello", "max_tokens": 2}


@pytest.fixture(scope="module")
def server(tiny_model_dir, chat_template_file):
    # No --chat-template (and the test tokenizer has none): chat must say so.
    args = [
        a
        for a in default_server_args(chat_template_file)
        if a not in ("--chat-template", chat_template_file)
    ]
    args += ["--served-model-name", "tiny", "--api-key", *KEYS, "--max-num-queued-reqs", "3"]
    srv = RemoteOpenAIServer(tiny_model_dir("llama"), args, api_key=KEYS[0])
    yield srv
    srv.stop()


def raw_request(
    port: int, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    """Send the path exactly as written (no client-side normalization)."""
    lines = [
        f"{method} {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Connection: close",
        f"Content-Length: {len(body)}",
    ]
    if body:
        lines.append("Content-Type: application/json")
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1]


def test_every_route_but_the_allow_list_needs_the_key(server):
    spec = httpx.get(server.url_for("openapi.json")).json()  # itself unguarded
    routes = [(method.upper(), path) for path, ops in spec["paths"].items() for method in ops]
    assert ("POST", "/v1/completions") in routes and ("GET", "/metrics") in routes
    for method, path in routes + [("GET", "/no-such-route"), ("POST", "/v2/x")]:
        r = httpx.request(method, server.url_for(path.lstrip("/")), json=BODY)
        if path in UNGUARDED_PATHS:
            assert r.status_code != 401, path
        else:
            assert r.status_code == 401, (method, path)
            assert r.json() == {"error": "Unauthorized"}
    for path in ("/health", "/ping", "/version"):
        assert httpx.get(server.url_for(path.lstrip("/"))).status_code == 200


def test_schema_declares_401(server):
    """/openapi.json says which routes may answer 401, with the body they send."""
    spec = httpx.get(server.url_for("openapi.json")).json()
    assert spec["components"]["schemas"]["UnauthorizedResponse"]["properties"]["error"]
    for path, operations in spec["paths"].items():
        for operation in operations.values():
            declared = "401" in operation["responses"]
            assert declared == (path not in UNGUARDED_PATHS), path
            if declared:
                assert operation["responses"]["401"]["content"]["application/json"]["schema"] == {
                    "$ref": "#/components/schemas/UnauthorizedResponse"
                }


def test_keys_are_checked(server):
    url = server.url_for("v1/completions")
    for key in KEYS:
        assert (
            httpx.post(url, json=BODY, headers={"Authorization": f"Bearer {key}"}).status_code
            == 200
        )
    assert (
        httpx.post(url, json=BODY, headers={"Authorization": f"bearer {KEYS[1]}"}).status_code
        == 200
    )
    for bad in ("Bearer sk-firs", "Bearer sk-first2", "Basic sk-first", "sk-first", ""):
        assert httpx.post(url, json=BODY, headers={"Authorization": bad}).status_code == 401
    # x-api-key (Anthropic clients): checked the same way, only without Authorization.
    assert httpx.post(url, json=BODY, headers={"x-api-key": KEYS[0]}).status_code == 200
    for bad in ("sk-firs", "sk-first2", "", f"Bearer {KEYS[0]}"):
        assert httpx.post(url, json=BODY, headers={"x-api-key": bad}).status_code == 401
    both = {"Authorization": "Bearer wrong", "x-api-key": KEYS[0]}
    assert httpx.post(url, json=BODY, headers=both).status_code == 401
    assert httpx.get(server.url_for("metrics"), headers=server.headers()).status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url_for("v1"), api_key="wrong", max_retries=0).models.list()
    assert server.get_client().models.list().data[0].id == "tiny"


@pytest.mark.parametrize(
    "path",
    [
        "//v1/completions",
        "/v1//completions",
        "/v1/../v1/completions",
        "/./v1/completions",
        "/%2Fv1/completions",
        "/v1%2Fcompletions",
        "/%761/completions",
        "/v1/completions/",
        "/health/../v1/completions",
        "/health%2F..%2Fv1%2Fcompletions",
        "/health/",
        "/HEALTH",
        "/tokenize",
        "/invocations",
        "/detokenize",
    ],
)
def test_no_spelling_gets_past_the_key(server, path):
    body = b'{"prompt": "hello", "max_tokens": 2}'
    status, _ = raw_request(server.port, "POST", path, body)
    assert status == 401, path


def test_preflight_passes(server):
    r = httpx.options(
        server.url_for("v1/completions"),
        headers={"Origin": "http://example.com", "Access-Control-Request-Method": "POST"},
    )
    assert r.status_code == 200


def test_queue_limit(server):
    """3 requests in flight fill the queue: the 4th gets 503 + Retry-After."""
    headers = server.headers()
    long_body = {**BODY, "max_tokens": 480, "min_tokens": 480, "ignore_eos": True, "stream": True}

    async def run():
        async with httpx.AsyncClient(timeout=60, headers=headers) as client:
            started = [asyncio.Event() for _ in range(3)]

            async def stream(event: asyncio.Event) -> None:
                async with client.stream(
                    "POST", server.url_for("v1/completions"), json=long_body
                ) as r:
                    assert r.status_code == 200
                    async for _ in r.aiter_lines():
                        event.set()

            tasks = [asyncio.create_task(stream(event)) for event in started]
            for event in started:
                await asyncio.wait_for(event.wait(), 30)
            r = await client.post(server.url_for("v1/completions"), json=BODY)
            assert r.status_code == 503 and r.headers["Retry-After"]
            assert "try again" in r.json()["error"]["message"]
            r = await client.post(server.url_for("v1/completions"), json={**BODY, "n": 2})
            assert r.status_code == 503
            await asyncio.gather(*tasks)
            r = await client.post(server.url_for("v1/completions"), json=BODY)
            assert r.status_code == 200

    asyncio.run(run())


def test_chat_without_template_is_a_bad_request(server):
    r = httpx.post(
        server.url_for("v1/chat/completions"),
        headers=server.headers(),
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 400 and "chat template" in r.json()["error"]["message"]
