"""Tool calling and reasoning on /v1/chat/completions through a real `vllm
serve` and the official `openai` client, on the embedded SmolLM2 model: ONE
server with `--enable-auto-tool-choice --tool-call-parser hermes
--reasoning-parser qwen3` (upstream: tests/entrypoints/openai/tool_use/,
test_chat_with_reasoning). Greedy sampling; a regex (structured outputs)
makes the model write a hermes call where the test needs one, and few-shot
history makes it write `</think>` where it needs reasoning. Requests are
few and short: every generated token costs on a small CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.entrypoints.openai.conftest import REPO_ROOT, RemoteOpenAIServer

MODEL = "smol"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The forecast of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
# Qwen3's switch: no reasoning, so the grammar applies from the first token.
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
HERMES_CALL = (
    r'<tool_call>\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{2,6}"\}\}</tool_call>'
)
TIMEOUT_S = 300  # liveness bound on a loaded 2-core machine, not a timing assertion


@pytest.fixture(scope="module")
def server(embedded_model_path):
    args = [
        "--served-model-name",
        MODEL,
        "--max-model-len",
        "1024",
        "--kv-cache-memory-bytes",
        str(64 * 2**20),
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--reasoning-parser",
        "qwen3",
        "--exclude-tools-when-tool-choice-none",
        "--trust-request-chat-template",
    ]
    srv = RemoteOpenAIServer(embedded_model_path, args)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.get_client(timeout=TIMEOUT_S)


def _create(client: openai.OpenAI, regex: str | None, **kw: Any) -> Any:
    extra = {**NO_THINKING, **kw.pop("extra_body", {})}
    if regex is not None:
        extra["structured_outputs"] = {"regex": regex}
    return client.chat.completions.create(
        model=MODEL,
        messages=kw.pop("messages", MESSAGES),
        tools=kw.pop("tools", [WEATHER]),
        temperature=0,
        max_tokens=kw.pop("max_tokens", 60),
        extra_body=extra,
        **kw,
    )


def _reassemble(stream: Any) -> dict[str, Any]:
    """The streamed chunks joined as one message (OpenAI's accumulation)."""
    out: dict[str, Any] = {"content": "", "reasoning": "", "calls": {}, "finish": []}
    for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            out["content"] += delta.content or ""
            out["reasoning"] += getattr(delta, "reasoning", None) or ""
            for call in delta.tool_calls or []:
                entry = out["calls"].setdefault(call.index, {"id": None, "name": "", "args": ""})
                entry["id"] = entry["id"] or call.id
                entry["name"] += call.function.name or ""
                entry["args"] += call.function.arguments or ""
            if choice.finish_reason is not None:
                out["finish"].append(choice.finish_reason)
    return out


def test_auto_tool_call_streamed_and_not(client):
    """tool_choice "auto" (the default with tools): the hermes call becomes
    message.tool_calls with JSON arguments, finish_reason "tool_calls"; the
    streamed deltas reassemble to the same call and no call text leaks."""
    response = _create(client, HERMES_CALL)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert not choice.message.content  # only the call: no content
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id and call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert list(arguments) == ["city"] and arguments["city"][0].isupper()

    streamed = _reassemble(_create(client, HERMES_CALL, stream=True))
    assert streamed["finish"] == ["tool_calls"]
    assert streamed["content"] == (choice.message.content or "")
    [only] = streamed["calls"].values()
    assert only["id"] and only["name"] == "get_weather"
    assert only["args"] == call.function.arguments


def test_forced_plain_answer_has_no_tool_calls(client):
    response = _create(client, r"It is sunny\.", tool_choice="auto")
    choice = response.choices[0]
    assert choice.message.content == "It is sunny."
    assert not choice.message.tool_calls and choice.finish_reason == "stop"


def test_broken_tool_call_comes_back_as_content(client):
    response = _create(client, r'<tool_call>\{"name": "get_weather", \}')
    choice = response.choices[0]
    assert not choice.message.tool_calls and choice.finish_reason == "stop"
    assert choice.message.content == '<tool_call>{"name": "get_weather", }'


# Few-shot history that makes SmolLM2 close its reasoning; the prompt ends
# inside `<think>` (continue_final_message), so the reasoning is still open.
THINK_SHOTS = [
    {"role": "system", "content": "Think inside <think> </think>, then answer in JSON."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": '<think>Two plus two is four.</think>{"answer": 4}'},
    {"role": "user", "content": "What is 3+3?"},
    {"role": "assistant", "content": "<think>"},
]
# Not what the few-shot answer looks like: only the grammar writes "unit".
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}, "unit": {"enum": ["apples"]}},
    "required": ["answer", "unit"],
    "additionalProperties": False,
}


def test_reasoning_then_json_schema_content(client):
    """--reasoning-parser qwen3: `reasoning` and `content` split (streamed and
    not, the same); the json_schema grammar constrains only the content."""
    body: dict[str, Any] = dict(
        model=MODEL,
        messages=THINK_SHOTS,
        temperature=0,
        max_tokens=40,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA},
        },
        extra_body={"continue_final_message": True, "add_generation_prompt": False},
    )
    message = client.chat.completions.create(**body).choices[0].message
    reasoning = message.model_extra["reasoning"]
    assert reasoning and "{" not in reasoning and "</think>" not in reasoning
    jsonschema.validate(json.loads(message.content), ANSWER_SCHEMA)

    streamed = _reassemble(client.chat.completions.create(stream=True, **body))
    assert (streamed["reasoning"], streamed["content"]) == (reasoning, message.content)
    assert streamed["finish"] == ["stop"]


@pytest.fixture(scope="module")
def tokenizer(embedded_model_path):
    from vllm.transformers_utils.tokenizer import get_tokenizer

    return get_tokenizer(embedded_model_path)


def _prompt_text(server: RemoteOpenAIServer, tokenizer: Any, **body: Any) -> str:
    """The rendered prompt, as the server's tokens decode (max_tokens 1)."""
    r = httpx.post(
        server.url_for("v1", "chat/completions"),
        json={"model": MODEL, "max_tokens": 1, "return_token_ids": True, **body},
        timeout=TIMEOUT_S,
    )
    assert r.status_code == 200, r.text
    return tokenizer.decode(r.json()["prompt_token_ids"])


TOOLS_TEMPLATE = (
    "{% for t in tools or [] %}TOOL {{ t.function.name }}\n{% endfor %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}"
    "{% for c in m.tool_calls or [] %} call({{ c.function.arguments.city }}){% endfor %}"
    "{% if m.tool_call_id %} [{{ m.tool_call_id }}]{% endif %}{{ '\\n' }}{% endfor %}assistant:"
)
HISTORY = [
    *MESSAGES,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]


def test_tool_history_and_exclude_tools_when_tool_choice_none(server, tokenizer):
    """Tool messages and assistant tool_calls reach the template (arguments as
    a dict); --exclude-tools-when-tool-choice-none drops the tools for "none"."""
    body = dict(messages=HISTORY, tools=[WEATHER], chat_template=TOOLS_TEMPLATE, **NO_THINKING)
    with_tools = _prompt_text(server, tokenizer, **body)
    assert with_tools == (
        "TOOL get_weather\nuser: What is the weather in Paris?\n"
        "assistant:  call(Paris)\ntool: sunny [call_1]\nassistant:"
    )
    without = _prompt_text(server, tokenizer, tool_choice="none", **body)
    assert without == with_tools.removeprefix("TOOL get_weather\n")


BAD = {
    "tool message without tool_call_id": (
        {"messages": [*MESSAGES, {"role": "tool", "content": "sunny"}]},
        "tool_call_id",
    ),
    "tool without a function name": (
        {"tools": [{"type": "function", "function": {"parameters": {}}}]},
        "name",
    ),
    "tool parameters not an object": (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]},
        "parameters",
    ),
    "history arguments that are not JSON": (
        {
            "messages": [
                *MESSAGES,
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{x"}}],
                },
            ]
        },
        "not valid JSON",
    ),
}


@pytest.mark.parametrize("body,message", BAD.values(), ids=list(BAD))
def test_bad_tool_input_is_400(server, body, message):
    request = {"model": MODEL, "messages": MESSAGES, "tools": [WEATHER], "max_tokens": 1, **body}
    r = httpx.post(server.url_for("v1", "chat/completions"), json=request, timeout=TIMEOUT_S)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == 400 and error["type"] and message in error["message"], error


@pytest.mark.parametrize(
    "flags,listed",
    [
        (["--enable-auto-tool-choice", "--tool-call-parser", "nope"], "hermes"),
        (["--reasoning-parser", "nope"], "deepseek_r1"),
        (["--enable-auto-tool-choice"], "requires --tool-call-parser"),
    ],
)
def test_bad_parser_flags_refuse_to_start(flags, listed):
    """Refused before the engine starts, with the registered names."""
    proc = subprocess.run(
        [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert proc.returncode != 0
    assert listed in proc.stderr, proc.stderr[-2000:]
