"""The Responses <-> chat translation without a server: input items as chat
messages, chat deltas as output items and events (reasoning, text and calls
in one stream), and the bounded store. Expected values are written by hand
from OpenAI's Responses API reference."""

from __future__ import annotations

import asyncio
import random

import pytest

from vllm.entrypoints.openai.responses.protocol import ResponsesRequest, ResponsesResponse
from vllm.entrypoints.openai.responses.store import ResponseStore, StoredResponse
from vllm.entrypoints.openai.responses.streaming_events import OutputBuilder, sse
from vllm.entrypoints.openai.responses.utils import (
    construct_input_messages,
    input_to_messages,
    output_to_messages,
    to_chat_request,
)
from vllm.exceptions import VLLMValidationError


def test_input_items_as_chat_messages():
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "S"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {
            "type": "function_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "two"}],
        },
    ]
    assert input_to_messages(items) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Let me look."}],
            "reasoning": "S",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"a": 1}'},
                },
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "two"}]},
    ]


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"type": "function_call_output", "output": "x"}, "input[0]"),
        ({"type": "function_call", "call_id": "c", "arguments": "{}"}, "input[0]"),
        ({"role": "tool", "content": "x"}, "input[0].role"),
        (
            {"role": "user", "content": [{"type": "input_image", "image_url": "u"}]},
            "input[0].content[0]",
        ),
        ({"role": "user", "content": 5}, "input[0].content"),
        ({"type": "reasoning", "encrypted_content": "xyz"}, "input[0].encrypted_content"),
        ({"type": "web_search_call", "id": "w"}, "input[0].type"),
        ("just a string", "input[0]"),
    ],
)
def test_bad_items_name_their_place(item, param):
    with pytest.raises(VLLMValidationError) as info:
        input_to_messages([item])
    assert info.value.parameter == param


def test_history_and_instructions():
    """The new instructions lead; the stored conversation has none."""
    request = ResponsesRequest(input="Next?", instructions="New rules.")
    history = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]
    messages, conversation = construct_input_messages(request, history)
    assert messages == [{"role": "system", "content": "New rules."}, *history, conversation[-1]]
    assert conversation == [*history, {"role": "user", "content": "Next?"}]


def test_output_as_history():
    output = [
        {
            "type": "reasoning",
            "id": "rs",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "R"}],
        },
        {"type": "message", "content": [{"type": "output_text", "text": "Calling."}]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
    ]
    assert output_to_messages(output) == [
        {
            "role": "assistant",
            "content": "Calling.",
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        }
    ]


def test_chat_request_fields():
    request = ResponsesRequest(
        input="Hi",
        max_output_tokens=7,
        tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        tool_choice={"type": "function", "name": "f"},
        text={"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}},
        include=["message.output_text.logprobs"],
        top_logprobs=2,
    )
    chat = to_chat_request(request, [{"role": "user", "content": "Hi"}], stream=True)
    assert chat.max_completion_tokens == 7 and chat.stream and chat.logprobs
    assert chat.top_logprobs == 2 and chat.stream_options.include_usage
    assert chat.tools[0].function.name == "f" and chat.tools[0].function.parameters == {
        "type": "object"
    }
    assert chat.tool_choice.function.name == "f"
    assert chat.response_format.json_schema.json_schema == {"type": "object"}


DELTAS = [
    {"role": "assistant", "content": ""},
    {"reasoning": "Think"},
    {"reasoning": "ing."},
    {"content": "Sure"},
    {"content": ", calling."},
    {
        "tool_calls": [
            {"index": 0, "id": "c0", "type": "function", "function": {"name": "f", "arguments": ""}}
        ]
    },
    {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": '}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]},
    {
        "tool_calls": [
            {
                "index": 1,
                "id": "c1",
                "type": "function",
                "function": {"name": "g", "arguments": "{}"},
            }
        ]
    },
]


def _stream(deltas: list[dict]) -> tuple[list[dict], list[dict]]:
    builder = OutputBuilder()
    events = [e for d in deltas for e in builder.on_delta(d)] + builder.finish()
    return events, builder.items


def test_events_of_reasoning_text_and_calls():
    events, items = _stream(DELTAS)
    assert [(e["type"], e.get("output_index")) for e in events] == [
        ("response.output_item.added", 0),
        ("response.content_part.added", 0),
        ("response.reasoning_text.delta", 0),
        ("response.reasoning_text.delta", 0),
        ("response.reasoning_text.done", 0),
        ("response.content_part.done", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1),
        ("response.content_part.added", 1),
        ("response.output_text.delta", 1),
        ("response.output_text.delta", 1),
        ("response.output_text.done", 1),
        ("response.content_part.done", 1),
        ("response.output_item.done", 1),
        ("response.output_item.added", 2),
        ("response.function_call_arguments.delta", 2),
        ("response.function_call_arguments.delta", 2),
        ("response.function_call_arguments.done", 2),
        ("response.output_item.done", 2),
        ("response.output_item.added", 3),
        ("response.function_call_arguments.delta", 3),
        ("response.function_call_arguments.done", 3),
        ("response.output_item.done", 3),
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["item"]["status"] == "in_progress" and events[0]["item"]["content"] == []
    assert [i["type"] for i in items] == ["reasoning", "message", "function_call", "function_call"]
    assert items[0]["content"] == [{"type": "reasoning_text", "text": "Thinking."}]
    assert items[1]["content"][0]["text"] == "Sure, calling."
    assert (items[2]["call_id"], items[2]["name"], items[2]["arguments"]) == ("c0", "f", '{"a": 1}')
    assert (items[3]["call_id"], items[3]["name"], items[3]["arguments"]) == ("c1", "g", "{}")
    assert all(i["status"] == "completed" for i in items)
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done == items


WHOLE = {
    "content": "Sure, calling.",
    "reasoning": "Thinking.",
    "tool_calls": [
        {"index": 0, "id": "c0", "function": {"name": "f", "arguments": '{"a": 1}'}},
        {"index": 1, "id": "c1", "function": {"name": "g", "arguments": "{}"}},
    ],
}


def _pieces(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, len(text) - 1)))
    return [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]


def _random_deltas(rng: random.Random) -> list[dict]:
    """WHOLE as a chat stream cut at random character boundaries."""
    deltas: list[dict] = [{"reasoning": p} for p in _pieces(WHOLE["reasoning"], rng)]
    deltas += [{"content": p} for p in _pieces(WHOLE["content"], rng)]
    for call in WHOLE["tool_calls"]:
        function = call["function"]
        head = {"index": call["index"], "id": call["id"], "function": {"name": function["name"]}}
        deltas.append({"tool_calls": [head]})
        for p in _pieces(function["arguments"], rng):
            deltas.append({"tool_calls": [{"index": call["index"], "function": {"arguments": p}}]})
    return deltas


def _without_ids(items: list[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if k != "id"} for item in items]


def test_one_delta_or_many_give_the_same_items():
    """The non-streamed path (the whole message as one delta) builds the
    streamed items, whatever the chunking (ids aside)."""
    _, expected = _stream([WHOLE])
    assert _without_ids(_stream(DELTAS)[1]) == _without_ids(expected)
    rng = random.Random(0)
    for _ in range(50):
        events, items = _stream(_random_deltas(rng))
        assert _without_ids(items) == _without_ids(expected)
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        assert text == WHOLE["content"]


def test_whitespace_before_a_call_is_no_message():
    call = {"index": 0, "id": "c", "function": {"name": "f", "arguments": "{}"}}
    _, items = _stream([{"content": " "}, {"content": "\n"}, {"tool_calls": [call]}])
    assert [i["type"] for i in items] == ["function_call"]
    _, items = _stream([{"content": " \n", "tool_calls": [call]}])
    assert [i["type"] for i in items] == ["function_call"]
    _, items = _stream([{"content": " "}, {"content": "Hi"}])
    assert items[0]["content"][0]["text"] == " Hi"
    _, items = _stream([{"content": "\n"}])
    assert items[0]["type"] == "message" and items[0]["content"][0]["text"] == "\n"


def test_sse_framing():
    frame = sse({"type": "response.created", "sequence_number": 0})
    assert (
        frame
        == 'event: response.created\ndata: {"type": "response.created", "sequence_number": 0}\n\n'
    )


def _entry(i: int, status: str = "completed") -> StoredResponse:
    request = ResponsesRequest(input="x", request_id=f"resp_{i}")
    response = ResponsesResponse.from_request(
        request, model_name="m", created_at=0, status=status, sampling_defaults={}
    )
    return StoredResponse(response=response)


def test_store_evicts_the_oldest_finished():
    store = ResponseStore(max_entries=3)
    store.put(_entry(0, "in_progress"))
    for i in range(1, 5):
        store.put(_entry(i))
    # 0 runs (never evicted); 1 and 2 were the oldest finished.
    assert [store.get(f"resp_{i}") is not None for i in range(5)] == [
        True,
        False,
        False,
        True,
        True,
    ]
    store.put(_entry(3))  # replacing keeps the count
    assert len(store) == 3
    with pytest.raises(ValueError, match="at least 1"):
        ResponseStore(max_entries=0)


def test_replay_follows_a_live_stream_and_ends_with_its_task():
    async def run() -> tuple[list[str], list[str]]:
        entry = _entry(0, "in_progress")
        entry.events, entry.new_event = [], asyncio.Event()

        async def produce() -> None:
            for i in range(5):
                await asyncio.sleep(0)
                entry.events.append(f"e{i}")
                entry.new_event.set()
            entry.task = None
            entry.new_event.set()

        entry.task = asyncio.create_task(produce())
        live = [frame async for frame in entry.replay()]
        later = [frame async for frame in entry.replay(starting_after=2)]
        return live, later

    live, later = asyncio.run(run())
    assert live == ["e0", "e1", "e2", "e3", "e4"] and later == ["e3", "e4"]


# What becomes of each request field: "chat" (reaches the chat request),
# "store" / "echo" (the response and the store), "refused" (a 400 naming it
# when set), "logged" (upstream's ignored-fields warning). A new field must
# be placed here, so that none is accepted and silently dropped.
REQUEST_FIELDS = {
    "background": "store",
    "include": "chat",  # message.output_text.logprobs; the other values: logged
    "input": "chat",
    "instructions": "chat",
    "max_output_tokens": "chat",
    "max_tool_calls": "refused",
    "metadata": "echo",
    "model": "chat",
    "logit_bias": "chat",
    "parallel_tool_calls": "chat",
    "previous_response_id": "store",
    "prompt": "refused",
    "reasoning": "logged",
    "service_tier": "echo",  # other than auto / default: logged
    "store": "store",
    "stream": "chat",
    "temperature": "chat",
    "text": "chat",  # format; verbosity: logged
    "tool_choice": "chat",
    "tools": "chat",
    "top_logprobs": "chat",
    "top_p": "chat",
    "top_k": "chat",
    "truncation": "refused",  # "auto"
    "user": "chat",
    "skip_special_tokens": "chat",
    "request_id": "chat",
    "mm_processor_kwargs": "refused",
    "priority": "chat",
    "cache_salt": "chat",
    "enable_response_messages": "refused",
    "previous_input_messages": "refused",
}


def test_every_request_field_has_a_fate():
    assert set(REQUEST_FIELDS) == set(ResponsesRequest.model_fields)
    request = ResponsesRequest(
        input="Hi",
        model="m",
        max_output_tokens=5,
        logit_bias={"1": 1.0},
        parallel_tool_calls=False,
        temperature=0.5,
        top_p=0.9,
        top_k=3,
        user="u",
        skip_special_tokens=False,
        priority=2,
        cache_salt="salt",
        tools=[{"type": "function", "name": "f"}],
        tool_choice="required",
    )
    chat = to_chat_request(request, [{"role": "user", "content": "Hi"}], stream=False)
    assert (chat.model, chat.max_completion_tokens, chat.logit_bias) == ("m", 5, {"1": 1.0})
    assert (chat.temperature, chat.top_p, chat.top_k, chat.user) == (0.5, 0.9, 3, "u")
    assert (chat.skip_special_tokens, chat.priority, chat.cache_salt) == (False, 2, "salt")
    assert chat.parallel_tool_calls is False and chat.tool_choice == "required"
    assert chat.request_id == request.request_id and not chat.stream
