"""The Anthropic Messages API through a real `vllm serve` (one server for the
module, the embedded SmolLM2 model) and the official `anthropic` client
(upstream: tests/entrypoints/anthropic/test_messages.py).

References are independent of the code under test: the same conversation
sent to /v1/chat/completions (greedy, so the same text) and rendered by
/tokenize in OpenAI's shape, written out by hand here.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from tests.entrypoints.openai.conftest import RemoteOpenAIServer

MODEL = "smol"
API_KEY = "anthropic-test-key"
# No JSON whitespace: the forced tool input is short and deterministic.
SO_CONFIG = '{"backend": "xgrammar", "disable_any_whitespace": true}'
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
SYSTEM = "You answer in one short sentence."
WEATHER = {
    "name": "get_weather",
    "description": "The forecast of a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
TIME = {
    "name": "get_time",
    "input_schema": {
        "type": "object",
        "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["zone"],
        "additionalProperties": False,
    },
}
TOOL_INPUTS = {
    "get_weather": {"city": {"Paris", "Rome", "Oslo"}},
    "get_time": {"zone": {"UTC", "CET"}},
}
# WEATHER and TIME as OpenAI function tools, written out by hand.
OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The forecast of a city.",
            "parameters": WEATHER["input_schema"],
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": TIME["input_schema"]}},
]
TIMEOUT_S = 120
# This client version has no `temperature` argument; the API field is sent as is.
GREEDY = {"temperature": 0.0}
# The server runs the qwen3 reasoning parser: `thinking` disabled (the
# template's enable_thinking false) makes the whole answer content.
NO_THINKING = {"type": "disabled"}


@pytest.fixture(scope="module")
def server(embedded_model_path):
    srv = RemoteOpenAIServer(
        embedded_model_path,
        [
            "--served-model-name",
            MODEL,
            "--max-model-len",
            "1024",
            "--kv-cache-memory-bytes",
            str(64 * 2**20),
            "--structured-outputs-config",
            SO_CONFIG,
            "--api-key",
            API_KEY,
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
            "--reasoning-parser",
            "qwen3",
        ],
        api_key=API_KEY,
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server) -> anthropic.Anthropic:
    # api_key: the client sends it as `x-api-key`, which the server accepts.
    return anthropic.Anthropic(
        base_url=server.url_root, api_key=API_KEY, max_retries=0, timeout=TIMEOUT_S
    )


def _post(server: RemoteOpenAIServer, path: str, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(
        server.url_for(path), json=body, headers=server.headers(), timeout=TIMEOUT_S, **kwargs
    )


def _chat_reference(
    server: RemoteOpenAIServer, messages: list[dict], thinking: bool = False, **body: Any
) -> Any:
    chat = server.get_client()
    extra = {"chat_template_kwargs": {"enable_thinking": thinking}, **body.pop("extra_body", {})}
    return chat.chat.completions.create(
        model=MODEL, messages=messages, temperature=0.0, extra_body=extra, **body
    )


GREEDY_KWARGS: dict[str, Any] = dict(
    model=MODEL,
    max_tokens=10,
    extra_body=GREEDY,
    thinking=NO_THINKING,
    system=SYSTEM,
    messages=QUESTION,
)


@pytest.fixture(scope="module")
def greedy(client) -> Any:
    """The greedy answer to QUESTION (system as a string)."""
    return client.messages.create(**GREEDY_KWARGS)


def test_message_equals_the_chat_completion(server, client, greedy):
    """System text blocks + a user turn: the text, token counts and finish of
    the same conversation on /v1/chat/completions."""
    message = client.messages.create(
        **{**GREEDY_KWARGS, "system": [{"type": "text", "text": SYSTEM}]}
    )
    reference = _chat_reference(
        server, [{"role": "system", "content": SYSTEM}, *QUESTION], max_completion_tokens=10
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.model == MODEL
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == reference.choices[0].message.content
    assert message.usage.input_tokens == reference.usage.prompt_tokens
    assert message.usage.output_tokens == reference.usage.completion_tokens
    expected = {"length": "max_tokens", "stop": "end_turn"}[reference.choices[0].finish_reason]
    assert message.stop_reason == expected and message.stop_sequence is None
    assert greedy.content[0].text == message.content[0].text  # a string system: the same


def test_stream_equals_non_stream(client, greedy):
    with client.messages.stream(**GREEDY_KWARGS) as stream:
        events = list(stream)
        final = stream.get_final_message()
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert types[-2] == "message_delta"
    assert types.count("content_block_start") == types.count("content_block_stop") == 1
    deltas = [e.delta.text for e in events if e.type == "content_block_delta"]
    assert "".join(deltas) == greedy.content[0].text == final.content[0].text
    assert final.stop_reason == greedy.stop_reason
    assert final.usage.input_tokens == greedy.usage.input_tokens
    assert final.usage.output_tokens == greedy.usage.output_tokens
    assert events[0].message.usage.input_tokens == greedy.usage.input_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequence(client, greedy, stream):
    text = greedy.content[0].text
    words = text.split()
    assert len(words) >= 3, text
    stop = " " + words[2]
    kwargs = {**GREEDY_KWARGS, "stop_sequences": [stop, "never-seen-xyz"]}
    if stream:
        with client.messages.stream(**kwargs) as events:
            cut = events.get_final_message()
    else:
        cut = client.messages.create(**kwargs)
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[: text.index(stop)]


def _check_tool_use(block: Any, names: set[str]) -> None:
    assert block.type == "tool_use" and block.name in names and block.id
    inputs = TOOL_INPUTS[block.name]
    assert set(block.input) == set(inputs)
    for key, allowed in inputs.items():
        assert block.input[key] in allowed


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool(client, stream):
    """tool_choice "tool": the named tool is called (the output is constrained
    to its input_schema); stop_reason tool_use; streamed as input_json_delta."""
    kwargs: dict[str, Any] = dict(
        model=MODEL,
        max_tokens=40,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER, TIME],
        tool_choice={"type": "tool", "name": "get_weather"},
        thinking=NO_THINKING,
    )
    if not stream:
        message = client.messages.create(**kwargs)
    else:
        with client.messages.stream(**kwargs) as events:
            kinds = {e.delta.type for e in events if e.type == "content_block_delta"}
            message = events.get_final_message()
        assert kinds == {"input_json_delta"}
    assert message.stop_reason == "tool_use"
    tool_uses = [b for b in message.content if b.type == "tool_use"]
    assert len(tool_uses) == 1
    _check_tool_use(tool_uses[0], {"get_weather"})


def test_any_tool(client):
    """tool_choice "any": one call or more, each of a given tool."""
    kwargs: dict[str, Any] = dict(
        model=MODEL,
        max_tokens=60,
        messages=[{"role": "user", "content": "What time is it in Oslo?"}],
        tools=[WEATHER, TIME],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        thinking=NO_THINKING,
    )
    message = client.messages.create(**kwargs)
    assert message.stop_reason == "tool_use"
    tool_uses = [b for b in message.content if b.type == "tool_use"]
    assert len(tool_uses) == 1  # disable_parallel_tool_use
    _check_tool_use(tool_uses[0], {"get_weather", "get_time"})


TOOL_HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": [{"type": "text", "text": "Weather in Rome?"}]},
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Rome"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": [{"type": "text", "text": "Sunny, 21 C"}],
            },
            {"type": "text", "text": "And now?"},
        ],
    },
]
# The same conversation in OpenAI's shape, written out by hand.
OPENAI_HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Weather in Rome?"},
    {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {
                "id": "toolu_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny, 21 C"},
    {"role": "user", "content": "And now?"},
]


def test_tool_history_renders_as_openai_messages(server, client):
    """tool_use / tool_result blocks become assistant tool_calls and a tool
    message: count_tokens and the Message's input tokens equal /tokenize of
    the hand-written OpenAI conversation (tools rendered too)."""
    tokenized = _post(
        server,
        "tokenize",
        {
            "model": MODEL,
            "messages": OPENAI_HISTORY,
            "tools": OPENAI_TOOLS,
            "chat_template_kwargs": {"enable_thinking": False},
        },
    )
    assert tokenized.status_code == 200, tokenized.text
    expected = tokenized.json()["count"]
    kwargs: dict[str, Any] = dict(
        model=MODEL,
        system=SYSTEM,
        messages=TOOL_HISTORY,
        tools=[WEATHER, TIME],
        thinking=NO_THINKING,
    )
    assert client.messages.count_tokens(**kwargs).input_tokens == expected
    message = client.messages.create(**kwargs, max_tokens=3, tool_choice={"type": "none"})
    assert message.usage.input_tokens == expected
    assert all(block.type == "text" for block in message.content)


def test_assistant_prefill_is_continued(server, client):
    """A last assistant message is continued (continue_final_message)."""
    prefill = "The capital of France is"
    message = client.messages.create(
        model=MODEL,
        max_tokens=6,
        extra_body=GREEDY,
        thinking=NO_THINKING,
        messages=[*QUESTION, {"role": "assistant", "content": prefill}],
    )
    reference = _chat_reference(
        server,
        [*QUESTION, {"role": "assistant", "content": prefill}],
        max_completion_tokens=6,
        extra_body={"add_generation_prompt": False, "continue_final_message": True},
    )
    assert message.content[0].text == reference.choices[0].message.content
    assert message.usage.input_tokens == reference.usage.prompt_tokens


def _error(response: httpx.Response, status: int, error_type: str, *needles: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == error_type, body
    for needle in needles:
        assert needle in body["error"]["message"], body


GOOD = {"model": MODEL, "max_tokens": 2, "messages": QUESTION}


@pytest.mark.parametrize(
    ("body", "needles"),
    [
        ({"model": MODEL, "messages": QUESTION}, ["max_tokens"]),
        ({**GOOD, "max_tokens": 0}, ["max_tokens"]),
        ({**GOOD, "messages": []}, ["messages"]),
        (
            {**GOOD, "container": "c1", "context_management": {}},
            ["container", "context_management", "not supported"],
        ),
        (
            {**GOOD, "thinking": {"type": "enabled", "budget_tokens": 2}},
            ["budget_tokens", "max_tokens"],
        ),
        ({**GOOD, "frobnicate": 1}, ["frobnicate"]),
        ({**GOOD, "stream": "yes"}, ["stream"]),
        (
            {**GOOD, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            ["image", "not supported"],
        ),
        (
            {
                **GOOD,
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "hi", "name": "x"}]}
                ],
            },
            ["name"],
        ),
        ({**GOOD, "tools": [WEATHER], "tool_choice": {"type": "tool"}}, ["tool_choice.name"]),
        ({**GOOD, "tools": [{**WEATHER, "type": "web_search_20250305"}]}, ["tools.0.type"]),
        ({**GOOD, "tools": [{"name": "no schema"}]}, ["tools.0"]),
        (
            {
                **GOOD,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
                    }
                ],
            },
            ["messages.0.content.0", "tool_use"],
        ),
        (
            {**GOOD, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
            ["tool_choice"],
        ),
        ({**GOOD, "max_tokens": 100_000}, ["maximum context length"]),
        ({**GOOD, "system": [{"type": "image"}]}, ["system"]),
    ],
)
def test_bad_request(server, body, needles):
    """Anthropic's envelope and a 400 naming the field, validation errors included."""
    _error(_post(server, "v1/messages", body), 400, "invalid_request_error", *needles)


def test_bad_bodies(server):
    url, headers = server.url_for("v1/messages"), server.headers()
    for raw in (b"[1, 2]", b'"text"', b"42", b"null", b"{not json"):
        r = httpx.post(url, content=raw, headers={**headers, "content-type": "application/json"})
        _error(r, 400, "invalid_request_error")
    r = httpx.post(url, data={"model": MODEL}, headers=headers)  # form-encoded
    _error(r, 400, "invalid_request_error", "application/json")
    count = {"model": MODEL, "messages": QUESTION}
    _error(
        _post(server, "v1/messages/count_tokens", {**count, "tool_choice": {"type": "any"}}),
        400,
        "invalid_request_error",
        "tools",
    )
    body = {**count, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}
    _error(_post(server, "v1/messages/count_tokens", body), 400, "invalid_request_error", "nope")
    _error(
        _post(server, "v1/messages/count_tokens", {"model": MODEL}),
        400,
        "invalid_request_error",
        "messages",
    )


def test_unknown_model_and_client_errors(server, client):
    _error(_post(server, "v1/messages", {**GOOD, "model": "nope"}), 404, "not_found_error", "nope")
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="nope", max_tokens=2, messages=QUESTION)
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        client.messages.create(model=MODEL, max_tokens=0, messages=QUESTION)


def test_auto_tool_choice_plain_answer(server, client):
    """tools with tool_choice auto (the default): the hermes parser finds no
    call in SmolLM2's answer, which comes back as text, as on the chat route
    (the streamed events of the same conversion: test_conversion.py)."""
    message = client.messages.create(**GREEDY_KWARGS, tools=[WEATHER, TIME])
    reference = _chat_reference(
        server,
        [{"role": "system", "content": SYSTEM}, *QUESTION],
        max_completion_tokens=10,
        tools=OPENAI_TOOLS,
        tool_choice="auto",
    ).choices[0]
    assert not reference.message.tool_calls
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == reference.message.content
    assert (
        message.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[reference.finish_reason]
    )


# Few-shot history that makes SmolLM2 close its reasoning; the prefill opens
# `<think>`, so the answer starts inside the reasoning (as the chat tests do).
THINK_SYSTEM = "Think inside <think> </think>, then answer in JSON."
THINK_SHOTS: list[dict[str, Any]] = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": '<think>Two plus two is four.</think>{"answer": 4}'},
    {"role": "user", "content": "What is 3+3?"},
    {"role": "assistant", "content": "<think>"},
]


def test_reasoning_becomes_thinking_blocks(server, client):
    """--reasoning-parser qwen3: the reasoning is a thinking block (streamed
    as thinking_delta), the rest a text block: the chat route's split."""
    kwargs: dict[str, Any] = dict(
        model=MODEL,
        max_tokens=24,
        extra_body=GREEDY,
        thinking={"type": "enabled", "budget_tokens": 16},
        system=THINK_SYSTEM,
        messages=THINK_SHOTS,
    )
    message = client.messages.create(**kwargs)
    reference = _chat_reference(
        server,
        [{"role": "system", "content": THINK_SYSTEM}, *THINK_SHOTS],
        thinking=True,
        max_completion_tokens=24,
        extra_body={"add_generation_prompt": False, "continue_final_message": True},
    ).choices[0]
    reasoning = reference.message.model_extra["reasoning"]
    assert reasoning and reference.message.content  # the model closed its reasoning
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == reasoning
    assert message.content[1].text == reference.message.content
    with client.messages.stream(**kwargs) as stream:
        kinds = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert kinds[0] == "thinking_delta" and "text_delta" in kinds

    def blocks(m: Any) -> list[tuple[str, str]]:
        return [(b.type, b.thinking if b.type == "thinking" else b.text) for b in m.content]

    assert blocks(final) == blocks(message)


def test_api_key_guards_the_routes(server):
    for path in ("v1/messages", "v1/messages/count_tokens"):
        r = httpx.post(server.url_for(path), json=GOOD, timeout=TIMEOUT_S)
        assert r.status_code == 401, r.text
        r = httpx.post(server.url_for(path), json=GOOD, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401, r.text
        r = httpx.post(server.url_for(path), json=GOOD, headers={"x-api-key": "wrong"})
        assert r.status_code == 401, r.text
    # The official client's api_key= (sent as x-api-key) and auth_token= (Bearer) both work.
    bearer = anthropic.Anthropic(base_url=server.url_root, auth_token=API_KEY, max_retries=0)
    assert bearer.messages.count_tokens(model=MODEL, messages=QUESTION).input_tokens > 0


def test_openapi_declares_the_routes(server):
    spec = httpx.get(server.url_for("openapi.json"), timeout=TIMEOUT_S).json()
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        responses = spec["paths"][path]["post"]["responses"]
        for status in ("400", "404", "500"):
            ref = responses[status]["content"]["application/json"]["schema"]
            assert ref == {"$ref": "#/components/schemas/AnthropicErrorResponse"}, path
        assert "422" not in responses
    assert (
        "text/event-stream" in spec["paths"]["/v1/messages"]["post"]["responses"]["200"]["content"]
    )
    body = spec["paths"]["/v1/messages"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/AnthropicMessagesRequest"}


def test_stream_error_event(server):
    """A request refused before streaming is a plain 400; the raw event
    stream of a good one is Anthropic's (no OpenAI `data: [DONE]`)."""
    r = _post(server, "v1/messages", {**GOOD, "stream": True, "max_tokens": 100_000})
    _error(r, 400, "invalid_request_error", "maximum context length")
    r = _post(server, "v1/messages", {**GOOD, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in r.text.split("\n\n") if f.strip()]
    assert all(f.startswith("event: ") for f in frames), frames
    for frame in frames:
        name, data = frame.split("\n", 1)
        assert json.loads(data.removeprefix("data: "))["type"] == name.removeprefix("event: ")
    assert "[DONE]" not in r.text


def test_type_confusion_is_never_a_server_error(server):
    """A value of the wrong type (or out of range) in any documented field of
    either request: a 4xx in Anthropic's envelope, never a 5xx."""
    spec = httpx.get(server.url_for("openapi.json"), timeout=TIMEOUT_S).json()
    schemas = spec["components"]["schemas"]
    bases = {
        "/v1/messages": GOOD,
        "/v1/messages/count_tokens": {"model": MODEL, "messages": QUESTION},
    }
    for path, base in bases.items():
        body = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        fields = schemas[body["schema"]["$ref"].rsplit("/", 1)[-1]]["properties"]
        assert {"model", "messages", "system", "tools", "tool_choice"} <= set(fields)
        for field in fields:
            for value in ("x", 2**70, [{}]):
                r = _post(server, path.lstrip("/"), {**base, field: value})
                assert r.status_code < 500, (path, field, value, r.text)
                if r.status_code != 200:
                    assert r.json()["type"] == "error", (path, field, value, r.text)
