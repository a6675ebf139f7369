"""/v1/responses through a real `vllm serve` (one server for the module, the
embedded SmolLM2 model) and the official `openai` client's `responses` API
(upstream: tests/entrypoints/openai/responses/test_basic.py, test_stateful.py,
test_function_call.py, test_structured_output.py). The server has the hermes
tool parser (SmolLM2 copies its `<tool_call>` format from a few-shot
history). No reasoning parser: with one, structured outputs wait for the end
of a reasoning SmolLM2 never writes (reasoning items are tested in
test_conversion.py).

References are independent of the code under test: the same conversation
sent to /v1/chat/completions (greedy, so the same text), written out by hand
in chat's shape.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai
import pytest

from tests.entrypoints.openai.conftest import RemoteOpenAIServer

MODEL = "smol"
API_KEY = "responses-test-key"
# No JSON whitespace: the forced tool arguments are short and deterministic.
SO_CONFIG = '{"backend": "xgrammar", "disable_any_whitespace": true}'
STORE_LIMIT = 3
QUESTION = "What is the capital of France?"
SYSTEM = "You answer in one short sentence."
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The forecast of a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
TIME = {
    "type": "function",
    "name": "get_time",
    "parameters": {
        "type": "object",
        "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["zone"],
        "additionalProperties": False,
    },
}
TOOL_ARGS = {
    "get_weather": {"city": {"Paris", "Rome", "Oslo"}},
    "get_time": {"zone": {"UTC", "CET"}},
}
TIMEOUT_S = 120


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
        ],
        env={
            "VLLM_ENABLE_RESPONSES_API_STORE": "1",
            "VLLM_RESPONSES_API_STORE_MAX_ENTRIES": str(STORE_LIMIT),
        },
        api_key=API_KEY,
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return server.get_client(timeout=TIMEOUT_S)


def _create(client: openai.OpenAI, **kwargs: Any) -> Any:
    return client.responses.create(model=MODEL, temperature=0.0, **kwargs)


def _chat(client: openai.OpenAI, messages: list[dict], **kwargs: Any) -> Any:
    return client.chat.completions.create(model=MODEL, messages=messages, temperature=0.0, **kwargs)


def _post(server: RemoteOpenAIServer, path: str, body: Any = None) -> httpx.Response:
    return httpx.post(server.url_for(path), json=body, headers=server.headers(), timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def plain(client) -> tuple[Any, Any]:
    """instructions + a string input, and the same conversation on chat."""
    response = _create(client, instructions=SYSTEM, input=QUESTION, max_output_tokens=6)
    reference = _chat(
        client,
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
        max_completion_tokens=6,
    )
    return response, reference


def test_response_equals_the_chat_completion(plain):
    """The text, token counts and finish of the same chat conversation; a
    length finish is status "incomplete" (max_output_tokens)."""
    response, reference = plain
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.model == MODEL and response.instructions == SYSTEM
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text == reference.choices[0].message.content
    assert response.usage.input_tokens == reference.usage.prompt_tokens
    assert response.usage.output_tokens == reference.usage.completion_tokens
    assert response.max_output_tokens == 6
    expected = {"length": "incomplete", "stop": "completed"}[reference.choices[0].finish_reason]
    assert response.status == expected
    if expected == "incomplete":
        assert response.incomplete_details.reason == "max_output_tokens"


def test_stream_events(client, plain):
    """Upstream's event types in order, sequence numbers 0..n-1, and the
    streamed text equals the non-streamed one."""
    full, _ = plain
    events = list(
        _create(client, stream=True, instructions=SYSTEM, input=QUESTION, max_output_tokens=6)
    )
    types = [e.type for e in events]
    deltas = types.count("response.output_text.delta")
    assert deltas >= 1
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    final = events[-1].response
    assert text == done.text == final.output_text == full.output_text
    assert final.status == full.status and final.usage.output_tokens == full.usage.output_tokens
    item_ids = {e.item_id for e in events if hasattr(e, "item_id")}
    assert item_ids == {final.output[0].id}


def test_input_items_equal_chat_messages(client):
    """A list of items (input_text parts, an assistant output_text message,
    a developer message) is the chat conversation written by hand."""
    items = [
        {"role": "developer", "content": SYSTEM},
        {"role": "user", "content": [{"type": "input_text", "text": "Hi, I am Ann."}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hello Ann!", "annotations": []}],
        },
        {"role": "user", "content": "What is my name?"},
    ]
    response = _create(client, input=items, max_output_tokens=4)
    reference = _chat(
        client,
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Hi, I am Ann."},
            {"role": "assistant", "content": "Hello Ann!"},
            {"role": "user", "content": "What is my name?"},
        ],
        max_completion_tokens=4,
    )
    assert response.output_text == reference.choices[0].message.content
    assert response.usage.input_tokens == reference.usage.prompt_tokens


def test_previous_response_id(client):
    """The previous response's input and output come first; its instructions
    do not carry over. retrieve() returns what create() did."""
    first = _create(client, instructions=SYSTEM, input="My name is Mark.", max_output_tokens=4)
    second = _create(
        client, input="What is my name?", previous_response_id=first.id, max_output_tokens=4
    )
    reference = _chat(
        client,
        [
            {"role": "user", "content": "My name is Mark."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"},
        ],
        max_completion_tokens=4,
    )
    assert second.previous_response_id == first.id
    assert second.output_text == reference.choices[0].message.content
    assert second.usage.input_tokens == reference.usage.prompt_tokens
    stored = client.responses.retrieve(first.id)
    assert stored.model_dump() == first.model_dump()
    unstored = _create(client, input=QUESTION, max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError, match="Response with id .* not found."):
        client.responses.retrieve(unstored.id)


def test_store_is_bounded(client):
    """VLLM_RESPONSES_API_STORE_MAX_ENTRIES: the oldest response is evicted."""
    oldest = _create(client, input="a", max_output_tokens=1)
    newer = [_create(client, input="b", max_output_tokens=1) for _ in range(STORE_LIMIT)]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(oldest.id)
    for response in newer:
        assert client.responses.retrieve(response.id).id == response.id
    with pytest.raises(openai.NotFoundError):
        _create(client, input="c", previous_response_id=oldest.id, max_output_tokens=1)


def _check_call(item: Any, names: set[str]) -> None:
    assert item.type == "function_call" and item.name in names
    assert item.call_id and item.id and item.status == "completed"
    arguments = json.loads(item.arguments)
    assert set(arguments) == set(TOOL_ARGS[item.name])
    for key, allowed in TOOL_ARGS[item.name].items():
        assert arguments[key] in allowed


@pytest.mark.parametrize(
    ("stream", "tool_choice"),
    [(True, "required"), (False, {"type": "function", "name": "get_weather"})],
)
def test_function_call(client, stream, tool_choice):
    """A forced tool choice: function_call items with JSON arguments that fit
    the tool's schema; streamed as function_call_arguments deltas."""
    kwargs: dict[str, Any] = dict(
        input="What is the weather in Paris?",
        tools=[WEATHER, TIME],
        tool_choice=tool_choice,
        parallel_tool_calls=False,
        max_output_tokens=40,
    )
    if not stream:
        response = _create(client, **kwargs)
    else:
        events = list(_create(client, stream=True, **kwargs))
        response = events[-1].response
        assert [e.sequence_number for e in events] == list(range(len(events)))
        deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert len(done) == 1 and "".join(deltas) == done[0].arguments
        assert done[0].arguments == response.output[0].arguments
    names = {"get_weather"} if isinstance(tool_choice, dict) else {"get_weather", "get_time"}
    assert response.status == "completed" and len(response.output) == 1
    _check_call(response.output[0], names)


def test_function_call_output_round_trip(client):
    """function_call + function_call_output items are the assistant tool_calls
    message and the tool message of chat."""
    call = _create(
        client,
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        max_output_tokens=40,
    ).output[0]
    items = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name},
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 25 C."},
    ]
    items[1]["arguments"] = call.arguments
    response = _create(
        client, input=items, tools=[WEATHER], tool_choice="none", max_output_tokens=4
    )
    reference = _chat(
        client,
        [
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 25 C."},
        ],
        tools=[{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}],
        tool_choice="none",
        max_completion_tokens=4,
    )
    assert response.output_text == reference.choices[0].message.content
    assert response.usage.input_tokens == reference.usage.prompt_tokens


def _shot(city: str) -> str:
    """An answer that calls get_weather in hermes' format."""
    call = json.dumps({"name": "get_weather", "arguments": {"city": city}})
    return f"<tool_call>\n{call}\n</tool_call>"


FEW_SHOT = [
    {"role": "user", "content": "What is the weather in Rome?"},
    {"role": "assistant", "content": _shot("Rome")},
    {"role": "user", "content": "What is the weather in Oslo?"},
    {"role": "assistant", "content": _shot("Oslo")},
    {"role": "user", "content": "What is the weather in Paris?"},
]


def test_auto_tool_call(client):
    """tool_choice "auto": the server's tool parser (hermes) finds the call,
    as chat finds it for `tool_calls`; streamed, the same item."""
    kwargs: dict[str, Any] = dict(input=FEW_SHOT, tools=[WEATHER], max_output_tokens=40)
    response = _create(client, **kwargs)
    reference = _chat(
        client,
        FEW_SHOT,
        tools=[{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}],
        max_completion_tokens=40,
    )
    assert reference.choices[0].finish_reason == "tool_calls"
    call = reference.choices[0].message.tool_calls[0].function
    assert [item.type for item in response.output] == ["function_call"]
    assert (response.output[0].name, response.output[0].arguments) == (call.name, call.arguments)
    assert json.loads(call.arguments) == {"city": "Paris"} and response.status == "completed"

    events = list(_create(client, stream=True, **kwargs))
    final = events[-1].response
    assert [e.sequence_number for e in events] == list(range(len(events)))
    arguments = "".join(
        e.delta for e in events if e.type == "response.function_call_arguments.delta"
    )
    assert arguments == call.arguments
    strip = [{**i.model_dump(), "id": None, "call_id": None} for i in final.output]
    assert strip == [{**i.model_dump(), "id": None, "call_id": None} for i in response.output]
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == ["function_call"]


def test_logprobs(client):
    """include message.output_text.logprobs: one entry per output token with
    top_logprobs alternatives; streamed on the text deltas."""
    kwargs: dict[str, Any] = dict(
        input="Hi", max_output_tokens=4, include=["message.output_text.logprobs"], top_logprobs=2
    )
    response = _create(client, **kwargs)
    logprobs = response.output[0].content[0].logprobs
    assert len(logprobs) == response.usage.output_tokens
    assert all(len(lp.top_logprobs) == 2 for lp in logprobs)
    assert "".join(lp.token for lp in logprobs) == response.output_text
    events = list(_create(client, stream=True, **kwargs))
    streamed = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    assert [(lp.token, lp.logprob) for lp in streamed] == [
        (lp.token, lp.logprob) for lp in logprobs
    ]


def test_text_format_json_schema(client):
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Rome"]},
            "capital": {"type": "boolean"},
        },
        "required": ["city", "capital"],
        "additionalProperties": False,
    }
    text = {"format": {"type": "json_schema", "name": "answer", "schema": schema}}
    response = _create(client, input=QUESTION, text=text, max_output_tokens=30)
    value = json.loads(response.output_text)
    assert set(value) == {"city", "capital"} and value["city"] in ("Paris", "Rome")
    assert isinstance(value["capital"], bool)
    assert response.text.format.type == "json_schema"


def test_background_poll_and_cancel(client):
    response = _create(client, input="Hi", background=True, max_output_tokens=4)
    assert response.status == "queued" and response.background
    deadline = time.monotonic() + TIMEOUT_S
    while response.status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.2)
        response = client.responses.retrieve(response.id)
    assert response.status in ("completed", "incomplete") and response.output_text
    with pytest.raises(openai.BadRequestError, match="Cannot cancel a synchronous response."):
        client.responses.cancel(response.id)

    long = _create(client, input="Write a long story.", background=True, max_output_tokens=900)
    cancelled = client.responses.cancel(long.id)
    assert cancelled.status == "cancelled"
    time.sleep(0.5)
    assert client.responses.retrieve(long.id).status == "cancelled"


def test_background_stream_and_replay(client, server):
    """background + stream: the events as they come, kept; GET with
    stream=true&starting_after=N sends the same events after N again."""
    events = list(_create(client, input="Hi", background=True, stream=True, max_output_tokens=4))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert final.background and final.status in ("completed", "incomplete")
    stored = client.responses.retrieve(final.id)
    assert stored.status == final.status and stored.output_text == final.output_text
    replay = list(client.responses.retrieve(final.id, stream=True, starting_after=2))
    assert [e.model_dump() for e in replay] == [e.model_dump() for e in events[3:]]
    not_streamed = _create(client, input="Hi", max_output_tokens=1)
    r = httpx.get(
        server.url_for(f"v1/responses/{not_streamed.id}"),
        params={"stream": "true"},
        headers=server.headers(),
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"input": QUESTION, "previous_response_id": "resp_unknown"}, 404, "previous_response_id"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, 400, "input[0]"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, 400, None),
        ({"input": [{"type": "item_reference", "id": "x"}]}, 400, "input[0].type"),
        ({"input": QUESTION, "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
        ({"input": QUESTION, "tools": [{"type": "function"}]}, 400, "tools[0]"),
        ({"input": 42}, 400, None),
        ({"input": []}, 400, "input"),
        ({"input": QUESTION, "prompt": {"id": "pmpt_1"}}, 400, "prompt"),
        ({"input": QUESTION, "truncation": "auto"}, 400, "truncation"),
        ({"input": QUESTION, "max_tool_calls": 2}, 400, "max_tool_calls"),
        ({"input": QUESTION, "background": True, "store": False}, 400, None),
        ({"input": QUESTION, "text": {"format": {"type": "json_schema", "name": "x"}}}, 400, None),
        ({"input": QUESTION, "tool_choice": "required"}, 400, "tool_choice"),
        ({"input": QUESTION, "max_output_tokens": 10**6}, 400, "max_output_tokens"),
        ({"input": QUESTION, "model": "nope"}, 404, "model"),
    ],
)
def test_bad_input(server, body, status, param):
    r = _post(server, "v1/responses", {"max_output_tokens": 4, **body})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == status and error["message"] and error["type"]
    if param is not None:
        assert error["param"] == param, error


def test_unknown_response_id(server):
    r = httpx.get(server.url_for("v1/responses/resp_unknown"), headers=server.headers())
    assert r.status_code == 404 and "not found" in r.json()["error"]["message"]
    r = _post(server, "v1/responses/resp_unknown/cancel")
    assert r.status_code == 404 and r.json()["error"]["code"] == 404


def test_api_key_guards_every_route(server):
    for method, path in [
        ("POST", "v1/responses"),
        ("GET", "v1/responses/resp_x"),
        ("POST", "v1/responses/resp_x/cancel"),
    ]:
        r = httpx.request(method, server.url_for(path), json={"input": "hi"})
        assert r.status_code == 401, (method, path)
