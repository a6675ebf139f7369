"""Structured outputs through `vllm serve` (one server for the module):
`response_format` and the `structured_outputs` extra field constrain what the
tiny random model writes; every bad constraint is a 400 with the error
envelope and the server keeps serving (upstream:
tests/entrypoints/openai/test_chat.py / test_completion.py structured-output
cases; serving contract "Structured output")."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys

import httpx
import pytest

from tests.entrypoints.openai.conftest import REPO_ROOT, RemoteOpenAIServer, default_server_args

PROMPT = "The quick brown fox jumps over"
MESSAGES = [{"role": "user", "content": "Describe the fox as JSON."}]
# JSON whitespace is off server-wide: a random model could otherwise pad a
# JSON value with whitespace until max_tokens.
SO_CONFIG = '{"backend": "xgrammar", "disable_any_whitespace": true}'
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "size": {"type": "string", "enum": ["S", "M", "L"]}},
    "required": ["ok", "size"],
    "additionalProperties": False,
}
GREEDY = {"temperature": 0.0, "max_tokens": 40}
# Liveness bound (not a timing assertion): a stuck request fails the test
# instead of hanging it.
TIMEOUT_S = 120
# Growth allowed over 1000 unique schemas (see the test for the measurements).
SERVER_MEMORY_GROWTH_LIMIT = 200 * 2**20
# Bound of the engine's compiled-grammar cache (upstream's default is 512 MiB,
# more than 1000 of the test's grammars take).
XGRAMMAR_CACHE_MB = "16"


@pytest.fixture(scope="module")
def server(tiny_model_dir, chat_template_file):
    srv = RemoteOpenAIServer(
        tiny_model_dir("llama"),
        default_server_args(chat_template_file)
        + ["--served-model-name", "tiny", "--structured-outputs-config", SO_CONFIG],
        env={"VLLM_XGRAMMAR_CACHE_MB": XGRAMMAR_CACHE_MB},
    )
    yield srv
    srv.stop()


def _post(server: RemoteOpenAIServer, route: str, body: dict) -> httpx.Response:
    return httpx.post(
        server.url_for("v1", route), json={"model": "tiny", **body}, timeout=TIMEOUT_S
    )


def _completion(server: RemoteOpenAIServer, **body) -> httpx.Response:
    return _post(server, "completions", {"prompt": PROMPT, **GREEDY, **body})


def _chat(server: RemoteOpenAIServer, **body) -> httpx.Response:
    return _post(server, "chat/completions", {"messages": MESSAGES, **GREEDY, **body})


def _assert_400(response: httpx.Response, param: str | None = None) -> dict:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == 400 and error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error


def _assert_alive(server: RemoteOpenAIServer) -> None:
    r = _completion(server, max_tokens=3)
    assert r.status_code == 200, r.text
    assert httpx.get(server.url_for("health"), timeout=10).status_code == 200


# ----------------------------------------------------------------------
# Constrained output (the engine enforces the constraint)
# ----------------------------------------------------------------------


def _check_schema_instance(value: object) -> None:
    assert isinstance(value, dict) and set(value) == {"ok", "size"}, value
    assert isinstance(value["ok"], bool) and value["size"] in ("S", "M", "L"), value


def test_chat_response_format_json_schema(server):
    r = _chat(
        server,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "fox", "schema": SCHEMA, "strict": True},
        },
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    _check_schema_instance(json.loads(choice["message"]["content"]))
    assert choice["finish_reason"] == "stop"


def test_completion_response_format_json_schema_streamed(server):
    body = {
        "prompt": PROMPT,
        **GREEDY,
        "stream": True,
        "model": "tiny",
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "fox", "schema": SCHEMA},
        },
    }
    text = ""
    with httpx.stream(
        "POST", server.url_for("v1", "completions"), json=body, timeout=TIMEOUT_S
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text += json.loads(line[6:])["choices"][0]["text"]
    _check_schema_instance(json.loads(text))


def test_response_format_json_object_beats_logit_bias(server, tiny_tokenizer):
    # A +100 bias on "}" makes it the model's pick at every step; only the
    # grammar can make the output start with "{" (then "}" closes the object).
    close = tiny_tokenizer.convert_tokens_to_ids("}")
    bias = {str(close): 100}
    free = _completion(server, logit_bias=bias, max_tokens=5, ignore_eos=True)
    assert free.status_code == 200 and free.json()["choices"][0]["text"] == "}" * 5
    for route, body in (
        ("completions", {"prompt": PROMPT}),
        ("chat/completions", {"messages": MESSAGES}),
    ):
        r = _post(
            server,
            route,
            {**body, **GREEDY, "logit_bias": bias, "response_format": {"type": "json_object"}},
        )
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        text = choice["text"] if "text" in choice else choice["message"]["content"]
        assert json.loads(text) == {}, text


def test_structured_outputs_choice_and_regex(server):
    colors = ["red", "green", "blue"]
    r = _completion(server, structured_outputs={"choice": colors})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] in colors
    r = _chat(server, structured_outputs={"choice": colors}, n=3, temperature=1.0, seed=1)
    assert r.status_code == 200, r.text
    assert all(c["message"]["content"] in colors for c in r.json()["choices"])
    r = _completion(server, structured_outputs={"regex": "[0-9]{3}-[a-z]{2}"})
    assert r.status_code == 200, r.text
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", r.json()["choices"][0]["text"])


# ----------------------------------------------------------------------
# Bad constraints: 400, and the server keeps serving
# ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "structured_outputs",
    [
        {"regex": {1: "a"}},  # not a string (JSON turns the key into "1")
        {},  # no constraint
        {"regex": "a+", "choice": ["a"]},  # two constraints
        {"choice": []},
        {"json_object": "maybe"},
        {"grammar": "   "},
        "regex",
    ],
)
def test_malformed_structured_outputs_is_400(server, structured_outputs):
    _assert_400(_completion(server, structured_outputs=structured_outputs))
    _assert_400(_chat(server, structured_outputs=structured_outputs))


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_schema"},
        {"type": "json_schema", "json_schema": {"name": "x"}},
        {"type": "json_schema", "json_schema": {"schema": SCHEMA}},  # OpenAI requires a name
        {"type": "xml"},
    ],
)
def test_malformed_response_format_is_400(server, response_format):
    _assert_400(_chat(server, response_format=response_format))


def test_response_format_and_structured_outputs_together_is_400(server):
    error = _assert_400(
        _chat(server, response_format={"type": "json_object"}, structured_outputs={"regex": "a"})
    )
    assert "structured_outputs" in error["message"]
    # A "text" response_format constrains nothing: no conflict.
    r = _chat(
        server, response_format={"type": "text"}, structured_outputs={"choice": ["yes", "no"]}
    )
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] in ("yes", "no")


def test_invalid_regex_is_400_and_server_stays_up(server):
    error = _assert_400(
        _completion(server, structured_outputs={"regex": "foo**"}), "structured_outputs"
    )
    assert "regex" in error["message"].lower()
    _assert_400(_chat(server, structured_outputs={"regex": "[unclosed"}), "structured_outputs")
    _assert_alive(server)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "no-such-type"}}},
        {"type": "string", "minLength": 5, "maxLength": 2},
    ],
)
def test_bad_json_schema_is_400_and_server_stays_up(server, schema):
    _assert_400(
        _chat(
            server,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "bad", "schema": schema},
            },
        ),
        "response_format",
    )
    _assert_400(_completion(server, structured_outputs={"json": schema}), "structured_outputs")
    _assert_400(_completion(server, structured_outputs={"json": "{not json"}), "structured_outputs")
    _assert_alive(server)


def test_bad_grammar_is_400(server):
    _assert_400(
        _completion(server, structured_outputs={"grammar": "root ::= (("}), "structured_outputs"
    )
    _assert_alive(server)


def test_redos_regex_does_not_stall_other_streams(server):
    """`(a+)+b` backtracks exponentially in a backtracking matcher; xgrammar
    compiles it to an automaton. Either a 400 or a normal answer, while a
    concurrent stream runs to its end."""

    async def stream_tokens(client: httpx.AsyncClient) -> int:
        body = {
            "model": "tiny",
            "prompt": PROMPT,
            "max_tokens": 24,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
        }
        n = 0
        async with client.stream("POST", server.url_for("v1", "completions"), json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    n += len(json.loads(line[6:])["choices"][0]["text"]) > 0
        return n

    async def redos(client: httpx.AsyncClient) -> httpx.Response:
        return await client.post(
            server.url_for("v1", "completions"),
            json={
                "model": "tiny",
                "prompt": PROMPT,
                "max_tokens": 16,
                "temperature": 0.0,
                "structured_outputs": {"regex": "(a+)+b"},
            },
        )

    async def main() -> tuple[int, httpx.Response]:
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
            return await asyncio.gather(stream_tokens(client), redos(client))

    streamed, r = asyncio.run(main())
    assert streamed > 0
    assert r.status_code in (200, 400), r.text
    if r.status_code == 200:
        text = r.json()["choices"][0]["text"]
        # The grammar allows only a prefix of a+b (max_tokens may cut it).
        assert re.fullmatch("a*b?", text), text


def _rss(server: RemoteOpenAIServer) -> int:
    """Resident memory of the server and its engine-core processes."""
    return sum(p.memory_info().rss for p in [server.ps, *server.engine_processes()])


def _send_unique_schemas(server: RemoteOpenAIServer, lo: int, hi: int) -> None:
    """One max_tokens=1 completion per schema `lo..hi-1`, 16 at a time; each
    schema (64 integer properties, unique names) compiles to its own grammar."""

    def schema(i: int) -> dict:
        names = [f"k{i}_{j}" for j in range(64)]
        return {
            "type": "object",
            "properties": {n: {"type": "integer"} for n in names},
            "required": names,
            "additionalProperties": False,
        }

    async def main() -> None:
        gate = asyncio.Semaphore(16)
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:

            async def one(i: int) -> None:
                async with gate:
                    r = await client.post(
                        server.url_for("v1", "completions"),
                        json={
                            "model": "tiny",
                            "prompt": PROMPT,
                            "max_tokens": 1,
                            "structured_outputs": {"json": schema(i)},
                        },
                    )
                assert r.status_code == 200, r.text

            await asyncio.gather(*(one(i) for i in range(lo, hi)))

    asyncio.run(main())


def test_many_unique_schemas_keep_memory_bounded(server):
    """Unique schemas must not grow memory without limit (xgrammar's grammar
    cache once did: GHSA-hf3c-wxg2-49q9). The server runs with a 16 MiB cache
    (VLLM_XGRAMMAR_CACHE_MB). Measured on the tiny model: over the last 1000
    of 3000 schemas the server and engine grow ~65 MiB (allocator settling;
    the first ~2000 compiles grow it faster, hence the warm-up); with the
    cache unbounded they grow ~480 MiB (~250 KiB per compiled grammar)."""
    _send_unique_schemas(server, 0, 2000)
    before = _rss(server)
    _send_unique_schemas(server, 2000, 3000)
    growth = _rss(server) - before
    print(f"RSS growth over 1000 unique schemas: {growth / 2**20:.1f} MiB")
    assert growth < SERVER_MEMORY_GROWTH_LIMIT, f"{growth / 2**20:.0f} MiB"
    _assert_alive(server)


# ----------------------------------------------------------------------
# Server configuration
# ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ('{"backend": "no-such-backend"}', "no-such-backend"),
        ('{"backend": "guidance"}', "not built"),
        ('{"no_such_key": 1}', "no_such_key"),
    ],
)
def test_bad_structured_outputs_config_refuses_to_start(tiny_model_dir, config, expected):
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        tiny_model_dir("llama"),
        "--port",
        "0",
        "--structured-outputs-config",
        config,
    ]
    proc = subprocess.run(
        cmd,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert proc.returncode != 0
    assert expected in proc.stderr, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir("llama"))
