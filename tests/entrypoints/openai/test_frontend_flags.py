"""The front-end flags of `vllm serve` that no other test shows (rows of
tests/entrypoints/test_flag_audit.py), against two real servers whose output is
captured to a file:

- `flagged`: two --served-model-name names, CORS lists, --allow-credentials,
  --response-role, --root-path,
  --enable-force-include-usage, --enable-prompt-tokens-details,
  --enable-log-requests, --trust-request-chat-template, --uvicorn-log-level trace,
  and uvicorn's access log left on (the default);
- `plain`: the defaults plus --disable-fastapi-docs and
  --disable-uvicorn-access-log, for contrast.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.entrypoints.openai.conftest import RemoteOpenAIServer, default_server_args

# Runs `vllm` with stdout / stderr (the engine child's too) sent to a file; the
# second argument "1" drops the --disable-uvicorn-access-log that
# RemoteOpenAIServer always passes, so the access log keeps its default (on).
_LAUNCH = """import os, sys
log, keep_access_log = sys.argv.pop(1), sys.argv.pop(1) == "1"
fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.dup2(fd, 1)
os.dup2(fd, 2)
if keep_access_log:
    sys.argv = [a for a in sys.argv if a != "--disable-uvicorn-access-log"]
from vllm.entrypoints.cli.main import main
main()
"""
ORIGIN = "http://ok.example"
LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 4  # > one 16-token block


class LoggedServer(RemoteOpenAIServer):
    def __init__(self, model: str, args: list[str], log: Path, keep_access_log: bool) -> None:
        self.log = log
        launcher = [sys.executable, "-c", _LAUNCH, str(log), "1" if keep_access_log else "0"]
        super().__init__(model, args, env={"PYTHONUNBUFFERED": "1"}, launcher=launcher)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for_log(self, needle: str, timeout: float = 15.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.log_text():
                return True
            time.sleep(0.2)
        return False


@pytest.fixture(scope="module")
def flagged(tiny_model_dir, chat_template_file, tmp_path_factory):
    args = default_server_args(chat_template_file) + [
        "--served-model-name",
        "tiny",
        "alias",
        "--allowed-origins",
        json.dumps([ORIGIN]),
        "--allow-credentials",
        "--allowed-methods",
        '["GET", "POST"]',
        "--allowed-headers",
        '["X-Custom"]',
        "--response-role",
        "bot",
        "--root-path",
        "/proxy",
        "--enable-force-include-usage",
        "--enable-prompt-tokens-details",
        "--enable-log-requests",
        "--trust-request-chat-template",
        "--uvicorn-log-level",
        "trace",
    ]
    log = tmp_path_factory.mktemp("flagged") / "server.log"
    srv = LoggedServer(tiny_model_dir("llama"), args, log, keep_access_log=True)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def plain(tiny_model_dir, chat_template_file, tmp_path_factory):
    args = default_server_args(chat_template_file) + [
        "--served-model-name",
        "tiny",
        "--disable-fastapi-docs",
    ]
    log = tmp_path_factory.mktemp("plain") / "server.log"
    srv = LoggedServer(tiny_model_dir("llama"), args, log, keep_access_log=False)
    yield srv
    srv.stop()


def _complete(server: RemoteOpenAIServer, **body) -> httpx.Response:
    body = {"model": "tiny", "prompt": "Hello", "max_tokens": 2, "temperature": 0, **body}
    r = httpx.post(server.url_for("v1/completions"), json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r


def _preflight(
    server: RemoteOpenAIServer, origin: str, method: str = "POST", headers: str = "X-Custom"
) -> httpx.Response:
    return httpx.options(
        server.url_for("v1/completions"),
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": method,
            "Access-Control-Request-Headers": headers,
        },
    )


def test_cors_flags(flagged):
    ok = _preflight(flagged, ORIGIN)
    assert ok.status_code == 200
    assert ok.headers["access-control-allow-origin"] == ORIGIN
    assert ok.headers["access-control-allow-credentials"] == "true"
    assert "POST" in ok.headers["access-control-allow-methods"]
    # Anything outside the three lists is refused by the preflight.
    assert _preflight(flagged, "http://evil.example").status_code == 400
    assert _preflight(flagged, ORIGIN, method="DELETE").status_code == 400
    assert _preflight(flagged, ORIGIN, headers="X-Other").status_code == 400
    simple = httpx.get(flagged.url_for("v1/models"), headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in simple.headers


def test_served_model_names(flagged):
    """Every name given is served, and a request may use any of them."""
    models = httpx.get(flagged.url_for("v1/models")).json()["data"]
    assert [m["id"] for m in models] == ["tiny", "alias"]
    assert _complete(flagged, model="alias").json()["model"] == "alias"
    r = httpx.post(flagged.url_for("v1/completions"), json={"model": "other", "prompt": "a"})
    assert r.status_code == 404


def test_response_role(flagged):
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "temperature": 0,
    }
    r = httpx.post(flagged.url_for("v1/chat/completions"), json=body, timeout=60).json()
    assert r["choices"][0]["message"]["role"] == "bot"


def test_root_path(flagged, plain):
    assert httpx.get(flagged.url_for("openapi.json")).json()["servers"] == [{"url": "/proxy"}]
    # A proxy that forwards the prefix: the routes answer under it too.
    assert httpx.get(flagged.url_for("proxy", "v1", "models")).json()["data"][0]["id"] == "tiny"


def test_force_include_usage(flagged):
    body = {"model": "tiny", "prompt": "Hello", "max_tokens": 3, "temperature": 0, "stream": True}
    with httpx.stream("POST", flagged.url_for("v1/completions"), json=body, timeout=60) as r:
        events = [
            json.loads(line[6:])
            for line in r.iter_lines()
            if line.startswith("data: ") and line != "data: [DONE]"
        ]
    # No stream_options in the request, yet the last chunk carries the usage.
    assert events[-1]["usage"]["completion_tokens"] == 3


def _usage(server: RemoteOpenAIServer, route: str, stream: bool) -> dict:
    """The final usage of a request on `route` (chat or completions)."""
    body: dict = {"model": "tiny", "max_tokens": 2, "temperature": 0}
    if route == "chat":
        path, body["messages"] = "v1/chat/completions", [{"role": "user", "content": LONG_PROMPT}]
    else:
        path, body["prompt"] = "v1/completions", LONG_PROMPT
    if not stream:
        r = httpx.post(server.url_for(path), json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["usage"]
    body.update(stream=True, stream_options={"include_usage": True})
    with httpx.stream("POST", server.url_for(path), json=body, timeout=60) as r:
        events = [
            json.loads(line[6:])
            for line in r.iter_lines()
            if line.startswith("data: ") and line != "data: [DONE]"
        ]
    return events[-1]["usage"]


@pytest.mark.parametrize("route", ["chat", "completions"])
@pytest.mark.parametrize("stream", [False, True])
def test_prompt_tokens_details(flagged, plain, route, stream):
    _usage(flagged, route, stream)
    usage = _usage(flagged, route, stream)
    assert usage["prompt_tokens_details"]["cached_tokens"] >= 16  # a prefix-cache hit
    assert _usage(plain, route, stream).get("prompt_tokens_details") is None


def test_enable_log_requests(flagged, plain):
    _complete(flagged)
    _complete(plain)
    assert flagged.wait_for_log("Added request")
    assert "Added request" not in plain.log_text()


def test_uvicorn_log_level_trace_logs_asgi_messages(flagged, plain):
    _complete(flagged)
    _complete(plain)
    assert flagged.wait_for_log("ASGI [")  # uvicorn's TRACE lines
    assert "ASGI [" not in plain.log_text()
    assert plain.wait_for_log("Application startup complete")  # level info: still logged


def test_access_log_is_on_by_default_and_off_with_the_flag(flagged, plain):
    _complete(flagged)
    _complete(plain)
    assert flagged.wait_for_log('"POST /v1/completions HTTP/1.1" 200')
    time.sleep(0.5)
    assert "POST /v1/completions" not in plain.log_text()


def test_disable_fastapi_docs(flagged, plain):
    for path in ("openapi.json", "docs", "redoc"):
        assert httpx.get(plain.url_for(path)).status_code == 404, path
        assert httpx.get(flagged.url_for(path)).status_code == 200, path
    assert httpx.get(plain.url_for("v1/models")).status_code == 200


def test_chat_template_flags(flagged):
    """--chat-template renders the prompt; --trust-request-chat-template lets a
    request bring its own (refused by default: tests/entrypoints/openai/
    test_serving.py::test_bad_request)."""
    messages = [{"role": "user", "content": "hi"}]

    def tokenize(**extra) -> dict:
        return httpx.post(
            flagged.url_for("tokenize"), json={"model": "tiny", "messages": messages, **extra}
        ).json()

    server_template = tokenize()
    plain_text = httpx.post(
        flagged.url_for("tokenize"), json={"model": "tiny", "prompt": "<|user|>hi\n<|assistant|>"}
    ).json()
    assert server_template["tokens"] == plain_text["tokens"]
    own = tokenize(chat_template="{{ messages[0]['content'] }}")
    assert (
        own["tokens"]
        == httpx.post(flagged.url_for("tokenize"), json={"model": "tiny", "prompt": "hi"}).json()[
            "tokens"
        ]
    )
