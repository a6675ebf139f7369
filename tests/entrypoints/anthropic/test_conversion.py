"""The Messages <-> chat translation without a server (upstream:
tests/entrypoints/anthropic/test_anthropic_messages_conversion.py,
test_message_stream_converter.py).

The streamed events are checked with the `anthropic` client's own
accumulator (the code that builds `stream.get_final_message()`): what it
reassembles must equal the non-streamed Message of the same chat output
(ids aside), for every way the chat deltas can be cut.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from anthropic.lib.streaming._messages import accumulate_event

from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
from vllm.entrypoints.anthropic.serving_messages import (
    AnthropicServingMessages,
    to_chat_completion_request,
)
from vllm.entrypoints.anthropic.stream_converter import convert_chat_stream, stop_reason_of
from vllm.entrypoints.openai.protocol import (
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessage,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    ToolCall,
    UsageInfo,
)
from vllm.exceptions import VLLMValidationError

WEATHER = {
    "name": "get_weather",
    "description": "Forecast",
    "input_schema": {"properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def _request(**body: Any) -> AnthropicMessagesRequest:
    return AnthropicMessagesRequest.model_validate(
        {"model": "m", "max_tokens": 7, "messages": [{"role": "user", "content": "hi"}], **body}
    )


def test_request_fields_carry_over():
    chat = to_chat_completion_request(
        _request(
            system=[{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
            stop_sequences=["END"],
            temperature=0.5,
            top_p=0.9,
            top_k=4,
            metadata={"user_id": "u1"},
            tools=[WEATHER],
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            stream=True,
        )
    )
    assert chat.max_completion_tokens == 7 and chat.stop == ["END"]
    assert (chat.temperature, chat.top_p, chat.top_k, chat.user) == (0.5, 0.9, 4, "u1")
    assert chat.messages[0].model_dump(exclude_none=True) == {"role": "system", "content": "A\nB"}
    assert chat.tool_choice == "required" and chat.parallel_tool_calls is False
    assert chat.tools is not None
    function = chat.tools[0].function
    assert function.name == "get_weather" and function.description == "Forecast"
    # input_schema without a type is an object schema (Anthropic's are).
    assert function.parameters == {"type": "object", **WEATHER["input_schema"]}
    assert chat.stream and chat.stream_options is not None
    assert chat.stream_options.include_usage and chat.stream_options.continuous_usage_stats
    assert chat.add_generation_prompt and not chat.continue_final_message


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "none"}, "none"),
        ({"type": "any"}, "required"),
    ],
)
def test_tool_choice(choice, expected):
    assert to_chat_completion_request(
        _request(tools=[WEATHER], tool_choice=choice)
    ).tool_choice == (expected)


def test_named_tool_choice():
    chat = to_chat_completion_request(
        _request(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"})
    )
    assert chat.tool_choice is not None and not isinstance(chat.tool_choice, str)
    assert chat.tool_choice.function.name == "get_weather"
    assert chat.parallel_tool_calls is True  # the default, not disabled


def test_conversation_blocks():
    """tool_use -> tool_calls, tool_result -> tool messages before the user's
    text, thinking -> reasoning, several texts -> text parts, is_error."""
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": [1, "é"]}},
                {"type": "tool_use", "id": "t2", "name": "g", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "one"},
                {
                    "type": "tool_result",
                    "tool_use_id": "t2",
                    "is_error": True,
                    "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}],
                },
                {"type": "text", "text": "next", "cache_control": {"type": "ephemeral"}},
            ],
        },
    ]
    chat = to_chat_completion_request(_request(messages=messages))
    got = [m.model_dump(exclude_none=True) for m in chat.messages]
    arguments = [
        json.loads(call["function"].pop("arguments")) for call in got[1].get("tool_calls", [])
    ]
    assert arguments == [{"x": [1, "é"]}, {}]
    assert got == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "reasoning": "hmm",
            "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "f"}},
                {"id": "t2", "type": "function", "function": {"name": "g"}},
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "one"},
        {"role": "tool", "tool_call_id": "t2", "content": "Error: x\ny"},
        {"role": "user", "content": "next"},
    ]


def test_prefill_continues_the_last_assistant_message():
    chat = to_chat_completion_request(
        _request(
            messages=[
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
            ]
        )
    )
    assert chat.continue_final_message and not chat.add_generation_prompt


@pytest.mark.parametrize(
    ("messages", "needle"),
    [
        (
            [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}],
            "messages.0.content.0",
        ),
        (
            [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}],
            "tool_result",
        ),
        (
            [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
                },
            ],
            "prefill",
        ),
    ],
)
def test_refused_conversations(messages, needle):
    with pytest.raises(VLLMValidationError, match=needle):
        to_chat_completion_request(_request(messages=messages))


@pytest.mark.parametrize(
    ("finish", "matched", "tools", "expected"),
    [
        ("stop", None, False, ("end_turn", None)),
        ("stop", 2, False, ("end_turn", None)),  # a stop token id, not a sequence
        ("stop", "END", False, ("stop_sequence", "END")),
        ("length", None, True, ("max_tokens", None)),
        ("tool_calls", None, True, ("tool_use", None)),
        ("stop", None, True, ("tool_use", None)),  # a named tool's call
        (None, None, False, ("end_turn", None)),
    ],
)
def test_stop_reason(finish, matched, tools, expected):
    assert stop_reason_of(finish, matched, tools) == expected


# ---------------------------------------------------------------------------
# Streamed events == the non-streamed Message
# ---------------------------------------------------------------------------

REASONING, CONTENT = "Let me think: é 日本", "Here you go."
CALLS = [("get_weather", '{"city": "Paris", "days": [1, 2]}'), ("get_time", '{"zone": "CET"}')]


def _full_response(finish: str, matched: str | None = None) -> ChatCompletionResponse:
    message = ChatMessage(
        role="assistant",
        content=CONTENT,
        reasoning=REASONING,  # the reasoning parser's field
        tool_calls=[
            ToolCall(id=f"call_{i}", function=FunctionCall(name=name, arguments=args))
            for i, (name, args) in enumerate(CALLS)
        ],
    )
    return ChatCompletionResponse(
        id="chatcmpl-abc",
        model="m",
        choices=[
            ChatCompletionResponseChoice(
                index=0, message=message, finish_reason=finish, stop_reason=matched
            )
        ],
        usage=UsageInfo(prompt_tokens=11, completion_tokens=22, total_tokens=33),
    )


def _chunks(cuts: int, finish: str, matched: str | None) -> list[str]:
    """The chat stream of _full_response: every text cut in `cuts` pieces."""

    def pieces(text: str) -> list[str]:
        size = max(1, -(-len(text) // cuts))
        return [text[i : i + size] for i in range(0, len(text), size)]

    deltas = [DeltaMessage(role="assistant", content="")]
    deltas += [DeltaMessage(reasoning=p) for p in pieces(REASONING)]
    deltas += [DeltaMessage(content=p) for p in pieces(CONTENT)]
    for index, (name, args) in enumerate(CALLS):
        first = DeltaToolCall(
            index=index, id=f"call_{index}", type="function", function=DeltaFunctionCall(name=name)
        )
        deltas.append(DeltaMessage(tool_calls=[first]))
        deltas += [
            DeltaMessage(
                tool_calls=[DeltaToolCall(index=index, function=DeltaFunctionCall(arguments=p))]
            )
            for p in pieces(args)
        ]
    usage = UsageInfo(prompt_tokens=11, completion_tokens=0, total_tokens=11)
    frames = []
    for i, delta in enumerate(deltas):
        last = i == len(deltas) - 1
        choice = ChatCompletionResponseStreamChoice(
            index=0,
            delta=delta,
            finish_reason=finish if last else None,
            stop_reason=matched if last else None,
        )
        frames.append(
            ChatCompletionStreamResponse(
                id="chatcmpl-abc", model="m", choices=[choice], usage=usage
            )
        )
    frames.append(
        ChatCompletionStreamResponse(
            id="chatcmpl-abc",
            model="m",
            choices=[],
            usage=UsageInfo(prompt_tokens=11, completion_tokens=22, total_tokens=33),
        )
    )
    return [f"data: {f.model_dump_json()}\n\n" for f in frames] + ["data: [DONE]\n\n"]


async def _frames(frames: list[str]) -> AsyncGenerator[str, None]:
    for frame in frames:
        yield frame


def _events(frames: list[str]) -> list[dict[str, Any]]:
    async def collect() -> list[str]:
        return [e async for e in convert_chat_stream(_frames(frames), "m")]

    events = []
    for raw in asyncio.run(collect()):
        name, data = raw.rstrip("\n").split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        events.append(event)
    return events


@pytest.mark.parametrize("cuts", [1, 2, 3, 7, 1000])
@pytest.mark.parametrize(("finish", "matched"), [("tool_calls", None), ("length", None)])
def test_stream_reassembles_to_the_message(cuts, finish, matched):
    events = _events(_chunks(cuts, finish, matched))
    snapshot = None
    json_bufs: dict[int, bytes] = {}
    for event in events:
        if event["type"] != "ping":
            snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)
    assert snapshot is not None
    streamed = snapshot.to_dict()
    full = AnthropicServingMessages.messages_full_converter(_full_response(finish, matched))
    expected = full.model_dump()
    assert streamed["id"] == expected["id"] == "msg_abc"
    assert streamed["content"] == expected["content"]
    assert [b["type"] for b in expected["content"]] == ["thinking", "text", "tool_use", "tool_use"]
    assert streamed["stop_reason"] == expected["stop_reason"]
    assert streamed["usage"]["input_tokens"] == expected["usage"]["input_tokens"] == 11
    assert streamed["usage"]["output_tokens"] == expected["usage"]["output_tokens"] == 22
    types = [e["type"] for e in events]
    assert types[:2] == ["message_start", "ping"] and types[-2:] == [
        "message_delta",
        "message_stop",
    ]
    assert types.count("content_block_start") == types.count("content_block_stop") == 4
    assert [e["index"] for e in events if e["type"] == "content_block_start"] == [0, 1, 2, 3]


def test_stop_sequence_streamed():
    text_only = [
        ChatCompletionStreamResponse(
            id="chatcmpl-x",
            model="m",
            choices=[
                ChatCompletionResponseStreamChoice(
                    index=0,
                    delta=DeltaMessage(content="ab"),
                    finish_reason="stop",
                    stop_reason="END",
                )
            ],
        )
    ]
    events = _events([f"data: {f.model_dump_json()}\n\n" for f in text_only] + ["data: [DONE]\n\n"])
    delta = next(e for e in events if e["type"] == "message_delta")
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


def test_error_frame_becomes_an_error_event():
    frames = _chunks(1, "length", None)[:3] + [
        'data: {"error": {"message": "boom", "type": "InternalServerError", "code": 500}}\n\n',
        "data: [DONE]\n\n",
    ]
    events = _events(frames)
    assert events[-1] == {"type": "error", "error": {"type": "api_error", "message": "boom"}}
    assert "message_stop" not in [e["type"] for e in events]


def test_full_message_without_output_or_with_broken_arguments():
    response = _full_response("stop")
    response.choices[0].message = ChatMessage(
        role="assistant", tool_calls=[ToolCall(function=FunctionCall(name="f", arguments="[1]"))]
    )
    message = AnthropicServingMessages.messages_full_converter(response)
    # Arguments that are not a JSON object are shown as text, not dropped.
    assert [b.model_dump() for b in message.content] == [{"type": "text", "text": "f([1])"}]
    assert message.stop_reason == "end_turn"
    response.choices[0].message = ChatMessage(role="assistant", content="")
    message = AnthropicServingMessages.messages_full_converter(response)
    assert [b.model_dump() for b in message.content] == [{"type": "text", "text": ""}]


@pytest.mark.parametrize(
    ("thinking", "kwargs", "expected"),
    [
        ({"type": "disabled"}, None, {"enable_thinking": False}),
        ({"type": "enabled", "budget_tokens": 3}, None, {"enable_thinking": True}),
        ({"type": "adaptive"}, {"x": 1}, {"x": 1, "enable_thinking": True}),
        # The client's own chat_template_kwargs win.
        ({"type": "disabled"}, {"enable_thinking": True}, {"enable_thinking": True}),
        (None, None, None),
    ],
)
def test_thinking_sets_enable_thinking(thinking, kwargs, expected):
    body: dict[str, Any] = {"chat_template_kwargs": kwargs}
    if thinking is not None:
        body["thinking"] = thinking
    assert to_chat_completion_request(_request(**body)).chat_template_kwargs == expected
