"""tool_choice "required" and named tools through `vllm serve` (one server for
the module): the output is constrained to the tools' JSON schema and comes
back as `message.tool_calls` / streamed tool-call deltas (upstream:
tests/entrypoints/openai/test_completion_with_function_calling.py,
tool_use/test_chat_completions.py). The tiny model is random: only the
structure is checked, never what it chose."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import pytest

from tests.entrypoints.openai.conftest import RemoteOpenAIServer, default_server_args
from vllm.entrypoints.openai.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.tool_choice import RequiredToolParser
from vllm.tool_parsers.utils import flush_tool_call_stream

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
# No JSON whitespace: a random model could otherwise pad the JSON until max_tokens.
SO_CONFIG = '{"backend": "xgrammar", "disable_any_whitespace": true}'
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The forecast of a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                "metric": {"type": "boolean"},
                "days": {"type": "integer", "enum": [1, 2, 3]},
            },
            "required": ["city", "metric", "days"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
PING = {"type": "function", "function": {"name": "ping"}}  # no parameters
TOOLS = [WEATHER, TIME, PING]
ARG_TYPES = {
    "get_weather": {"city": str, "metric": bool, "days": int},
    "get_time": {"zone": str},
    "ping": {},
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
# Liveness bound (not a timing assertion): a stuck request fails the test.
TIMEOUT_S = 120


@pytest.fixture(scope="module")
def server(tiny_model_dir, chat_template_file):
    srv = RemoteOpenAIServer(
        tiny_model_dir("llama"),
        default_server_args(chat_template_file)
        + ["--served-model-name", "tiny", "--structured-outputs-config", SO_CONFIG],
    )
    yield srv
    srv.stop()


def _chat(server: RemoteOpenAIServer, **body: Any) -> httpx.Response:
    body = {"model": "tiny", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 200, **body}
    return httpx.post(server.url_for("v1", "chat/completions"), json=body, timeout=TIMEOUT_S)


def _stream(server: RemoteOpenAIServer, **body: Any) -> list[dict]:
    """The choices of every chunk of a streamed chat."""
    body = {
        "model": "tiny",
        "messages": MESSAGES,
        "tools": TOOLS,
        "max_tokens": 200,
        "stream": True,
        **body,
    }
    choices = []
    with httpx.stream(
        "POST", server.url_for("v1", "chat/completions"), json=body, timeout=TIMEOUT_S
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                choices.extend(chunk["choices"])
    return choices


def _check_arguments(name: str, arguments: str) -> dict:
    args = json.loads(arguments)
    assert set(args) == set(ARG_TYPES[name]), (name, args)
    for key, kind in ARG_TYPES[name].items():
        assert type(args[key]) is kind, (name, args)
    return args


def _calls(choice: dict) -> list[tuple[str, dict]]:
    """(name, arguments) of a non-streamed choice's tool calls, checked."""
    message = choice["message"]
    assert message["content"] == "" and message["tool_calls"], message
    for call in message["tool_calls"]:
        assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-"), call
    return [
        (c["function"]["name"], _check_arguments(c["function"]["name"], c["function"]["arguments"]))
        for c in message["tool_calls"]
    ]


def _streamed_calls(
    choices: list[dict], index: int
) -> tuple[list[tuple[str, str]], list[str], str]:
    """(name, arguments text) of one streamed choice's calls, their ids and
    its finish_reason. A call's first delta carries id, type and name; later
    ones only argument text."""
    calls: dict[int, dict] = {}
    finish = None
    for choice in (c for c in choices if c["index"] == index):
        for delta in choice["delta"].get("tool_calls") or []:
            if delta["index"] not in calls:
                assert delta["type"] == "function" and delta["function"]["name"], delta
                assert delta["id"].startswith("chatcmpl-tool-"), delta
                calls[delta["index"]] = {
                    "id": delta["id"],
                    "name": delta["function"]["name"],
                    "args": delta["function"]["arguments"] or "",
                }
            else:
                assert delta["id"] is None and delta["function"]["name"] is None, delta
                calls[delta["index"]]["args"] += delta["function"]["arguments"]
        if choice["finish_reason"] is not None:
            assert finish is None, "two finish chunks"
            finish = choice["finish_reason"]
        assert not choice["delta"].get("content"), choice  # only tool calls
    assert sorted(calls) == list(range(len(calls))) and calls
    ordered = [calls[i] for i in sorted(calls)]
    return [(c["name"], c["args"]) for c in ordered], [c["id"] for c in ordered], finish


def _checked(calls: list[tuple[str, str]]) -> list[tuple[str, dict]]:
    return [(name, _check_arguments(name, args)) for name, args in calls]


# ----------------------------------------------------------------------
# Named tool
# ----------------------------------------------------------------------


def test_named_tool(server):
    r = _chat(server, tool_choice=NAMED, n=2, temperature=1.0, seed=3)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert len(choices) == 2
    ids = set()
    for choice in choices:
        calls = _calls(choice)
        assert [name for name, _ in calls] == ["get_weather"]
        ids |= {c["id"] for c in choice["message"]["tool_calls"]}
        assert choice["finish_reason"] == "stop"  # upstream: "stop" for a named tool
    assert len(ids) == 2


def test_named_tool_streamed_matches_non_streamed(server):
    full = _chat(server, tool_choice=NAMED, temperature=0.0)
    assert full.status_code == 200, full.text
    expected = _calls(full.json()["choices"][0])
    choices = _stream(server, tool_choice=NAMED, temperature=0.0, n=2)
    assert choices[0]["delta"]["role"] == "assistant"
    ids = []
    for index in (0, 1):
        calls, call_ids, finish = _streamed_calls(choices, index)
        assert _checked(calls) == expected and finish == "stop"
        ids += call_ids
    assert len(set(ids)) == 2


def test_named_tool_without_parameters_gets_empty_arguments(server):
    r = _chat(server, tool_choice={"type": "function", "function": {"name": "ping"}})
    assert r.status_code == 200, r.text
    assert _calls(r.json()["choices"][0]) == [("ping", {})]


# ----------------------------------------------------------------------
# "required"
# ----------------------------------------------------------------------

# The random model never ends the array by itself: parallel_tool_calls=false
# (maxItems 1) makes it end after one call.
ONE_CALL = {"tool_choice": "required", "parallel_tool_calls": False}


def test_required_with_two_tools(server):
    r = _chat(server, tools=[WEATHER, TIME], n=2, temperature=1.0, seed=5, **ONE_CALL)
    assert r.status_code == 200, r.text
    ids = []
    for choice in r.json()["choices"]:
        calls = _calls(choice)
        assert len(calls) == 1 and calls[0][0] in ("get_weather", "get_time")
        ids += [c["id"] for c in choice["message"]["tool_calls"]]
        assert choice["finish_reason"] == "tool_calls"
    assert len(set(ids)) == 2


def test_required_streamed_matches_non_streamed(server):
    full = _chat(server, temperature=0.0, **ONE_CALL)
    assert full.status_code == 200, full.text
    expected = _calls(full.json()["choices"][0])
    choices = _stream(server, temperature=0.0, n=2, **ONE_CALL)
    ids = []
    for index in (0, 1):
        calls, call_ids, finish = _streamed_calls(choices, index)
        assert _checked(calls) == expected and finish == "tool_calls"
        ids += call_ids
    assert len(set(ids)) == 2


def test_required_several_calls_streamed_matches_non_streamed(server):
    """Sampled with a seed (greedy ends this array after one call), the choices
    hold one or several calls, and max_tokens may cut an array short (seed 3:
    1, 2, 2 calls and one cut after 4). Streamed and not, each choice has the
    same calls with the same arguments text and finish_reason; a cut array
    keeps its complete calls, with finish_reason "length"."""
    body = {
        "tools": [WEATHER, TIME],
        "tool_choice": "required",
        "temperature": 1.0,
        "seed": 3,
        "n": 4,
        "max_tokens": 300,
    }
    full = _chat(server, **body)
    assert full.status_code == 200, full.text
    streamed = _stream(server, **body)
    most, cut = 0, 0
    for choice in full.json()["choices"]:
        calls, ids, finish = _streamed_calls(streamed, choice["index"])
        assert len(set(ids)) == len(ids) and finish == choice["finish_reason"]
        whole = [
            (c["function"]["name"], c["function"]["arguments"])
            for c in choice["message"]["tool_calls"]
        ]
        assert calls == whole
        _checked(calls)
        most = max(most, len(calls))
        cut += finish == "length"
        assert finish in ("tool_calls", "length")
    assert most >= 2 and cut >= 1


# Strings holding JSON's structural characters and escapes, scalar and nested
# parameters, any whitespace: what the scanner must see through.
SCANNED = (
    '[{"name": "a", "parameters": {"s": "x\\"}],{", "l": [1, {"b": null}]}}, '
    '{"name":"b","parameters":12},{"name":"c","parameters":"x,}"}, '
    '{"name": "d", "parameters" : true }, {"name": "\\u00e9", "parameters": {}}]'
)


@pytest.mark.parametrize("seed", range(20))
def test_required_parser_any_split(seed):
    """However the text is cut into deltas, the streamed calls reassemble
    into the non-streamed ones, arguments text included (no server)."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(SCANNED)), rng.randint(1, len(SCANNED) - 1)))
    request = ChatCompletionRequest(messages=MESSAGES, tools=TOOLS, tool_choice="required")
    parser, calls, text = RequiredToolParser(None), {}, ""
    deltas = []
    for a, b in zip([0, *cuts], [*cuts, len(SCANNED)]):
        deltas.append(
            parser.extract_tool_calls_streaming(
                text, text + SCANNED[a:b], SCANNED[a:b], [], [], [], request
            )
        )
        text += SCANNED[a:b]
    deltas.append(flush_tool_call_stream(parser, text, request))
    for delta in filter(None, deltas):
        assert not delta.content
        for call in delta.tool_calls:
            assert call.id is not None and call.index == len(calls)  # each call whole
            calls[call.index] = (call.function.name, call.function.arguments)
    whole = RequiredToolParser(None).extract_tool_calls(SCANNED, request)
    assert list(calls.values()) == [
        (c.function.name, c.function.arguments) for c in whole.tool_calls
    ]
    assert [{"name": n, "parameters": json.loads(a)} for n, a in calls.values()] == json.loads(
        SCANNED
    )


def test_required_parser_cut_array_and_not_an_array():
    request = ChatCompletionRequest(messages=MESSAGES, tools=TOOLS, tool_choice="required")
    cut = RequiredToolParser(None).extract_tool_calls(SCANNED[:90], request)
    assert [c.function.name for c in cut.tool_calls] == ["a"]
    other = RequiredToolParser(None).extract_tool_calls("no JSON here", request)
    assert not other.tools_called and other.content == "no JSON here"


def test_tool_choice_none_keeps_plain_content(server):
    r = _chat(server, tool_choice="none", max_tokens=5, ignore_eos=True)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["message"]["tool_calls"] == [] and choice["message"]["content"]
    assert choice["finish_reason"] == "length"


# ----------------------------------------------------------------------
# Refused requests
# ----------------------------------------------------------------------

BAD = {
    "unknown named tool": (
        {"tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice",
        "does not match any",
    ),
    "required without tools": (
        {"tools": None, "tool_choice": "required"},
        "tool_choice",
        "`tools` must be set",
    ),
    "empty tools": ({"tools": [], "tool_choice": "required"}, "tools", "empty"),
    "named and response_format": (
        {
            "tool_choice": NAMED,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
        },
        "tool_choice",
        "not both",
    ),
    "required and structured_outputs": (
        {"tool_choice": "required", "structured_outputs": {"choice": ["a"]}},
        "tool_choice",
        "not both",
    ),
    "auto without a parser": ({"tool_choice": "auto"}, "tool_choice", "--enable-auto-tool-choice"),
    "default (auto) without a parser": ({}, "tool_choice", "--enable-auto-tool-choice"),
    "conflicting $defs": (
        {
            "tool_choice": "required",
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": n,
                        "parameters": {"type": "object", "$defs": {"D": {"type": t}}},
                    },
                }
                for n, t in (("a", "string"), ("b", "integer"))
            ],
        },
        "tools",
        "multiple schemas",
    ),
    "schema that does not compile": (
        {
            "tool_choice": NAMED,
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "parameters": {"type": "no-such-type"}},
                }
            ],
        },
        "tools",
        None,
    ),
    "bad tool_choice string": ({"tool_choice": "sometimes"}, None, None),
}


@pytest.mark.parametrize("body,param,message", BAD.values(), ids=list(BAD))
@pytest.mark.parametrize("stream", [False, True])
def test_refused(server, body, param, message, stream):
    r = _chat(server, stream=stream, **body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == 400
    if param is not None:
        assert error["param"] == param, error
    if message is not None:
        assert message in error["message"], error
