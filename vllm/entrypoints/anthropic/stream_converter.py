"""Chat-completion SSE chunks -> Anthropic's Messages stream events (upstream:
`AnthropicServingMessages.message_stream_converter` in serving_messages.py).

Anthropic's stream, one `event: <type>` + `data: <json>` pair per event:

    message_start (the message with empty content and the input tokens), ping,
    then per content block: content_block_start, content_block_delta
    (text_delta / thinking_delta / input_json_delta) ..., content_block_stop;
    then message_delta (stop_reason, stop_sequence, usage) and message_stop.

Blocks follow the chat deltas in order: `delta.reasoning` opens a thinking
block, `delta.content` a text block, each tool call (by its `index`) a
tool_use block whose arguments stream as `partial_json`; a delta of another
kind closes the open block first. An error frame of the chat stream becomes
an `error` event, which ends the stream (no message_stop), as Anthropic's.
There is no `data: [DONE]` (not part of Anthropic's protocol).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

from vllm.entrypoints.anthropic.protocol import StopReason, anthropic_error_type
from vllm.entrypoints.openai.protocol import make_tool_call_id


def stop_reason_of(
    finish_reason: str | None, matched_stop: int | str | None, tool_called: bool
) -> tuple[StopReason, str | None]:
    """Anthropic's (stop_reason, stop_sequence) for a chat choice's finish.

    A forced tool (tool_choice "tool") ends with the chat's "stop": any tool
    call made is "tool_use" unless the output was cut at max_tokens."""
    if finish_reason == "length":
        return "max_tokens", None
    if tool_called or finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "stop" and isinstance(matched_stop, str):
        return "stop_sequence", matched_stop
    return "end_turn", None


def sse_event(event_type: str, data: dict[str, Any]) -> str:
    """One Anthropic SSE event: the `event:` name is the data's `type`."""
    payload = json.dumps({"type": event_type, **data}, ensure_ascii=False)
    return f"event: {event_type}\ndata: {payload}\n\n"


def message_id(chat_id: str) -> str:
    """Anthropic's `msg_` id for the chat request's id (same random part)."""
    return "msg_" + chat_id.removeprefix("chatcmpl-")


class MessageStreamConverter:
    """Turns the chat chunks (parsed JSON) of one choice into events."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.started = False
        self.index = -1  # the open (or last) block's index
        self.block: str | None = None  # "text", "thinking" or "tool"; None: none open
        self.tool_index: int | None = None  # the chat tool-call index of the open tool block
        self.tool_called = False
        self.finish_reason: str | None = None
        self.matched_stop: int | str | None = None
        self.input_tokens = 0
        self.output_tokens = 0

    def start(self, chat_id: str, model: str | None) -> list[str]:
        self.started = True
        message: dict[str, Any] = {
            "id": message_id(chat_id),
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": model or self.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
        }
        return [sse_event("message_start", {"message": message}), sse_event("ping", {})]

    def feed(self, chunk: dict[str, Any]) -> list[str]:
        """The events for one chat chunk."""
        usage = chunk.get("usage")
        if usage:
            self.input_tokens = usage.get("prompt_tokens") or 0
            self.output_tokens = usage.get("completion_tokens") or 0
        events = [] if self.started else self.start(chunk.get("id", ""), chunk.get("model"))
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue  # a Messages request has one choice
            events += self._delta(choice.get("delta") or {})
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
                self.matched_stop = choice.get("stop_reason")
        return events

    def _delta(self, delta: dict[str, Any]) -> list[str]:
        events: list[str] = []
        if delta.get("reasoning"):
            events += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            events.append(
                self._block_delta({"type": "thinking_delta", "thinking": delta["reasoning"]})
            )
        if delta.get("content"):
            events += self._open("text", {"type": "text", "text": ""})
            events.append(self._block_delta({"type": "text_delta", "text": delta["content"]}))
        for call in delta.get("tool_calls") or []:
            function = call.get("function") or {}
            if self.block != "tool" or self.tool_index != call.get("index", 0):
                block: dict[str, Any] = {
                    "type": "tool_use",
                    "id": call.get("id") or make_tool_call_id(),
                    "name": function.get("name") or "",
                    "input": {},
                }
                events += self._open("tool", block, force=True)
                self.tool_index = call.get("index", 0)
                self.tool_called = True
            if function.get("arguments"):
                events.append(
                    self._block_delta(
                        {"type": "input_json_delta", "partial_json": function["arguments"]}
                    )
                )
        return events

    def _open(self, kind: str, content_block: dict[str, Any], force: bool = False) -> list[str]:
        """Open a block of `kind` unless one is open (`force`: always a new one)."""
        if self.block == kind and not force:
            return []
        events = self._close()
        self.index += 1
        self.block = kind
        events.append(
            sse_event("content_block_start", {"index": self.index, "content_block": content_block})
        )
        return events

    def _close(self) -> list[str]:
        if self.block is None:
            return []
        self.block, self.tool_index = None, None
        return [sse_event("content_block_stop", {"index": self.index})]

    def _block_delta(self, delta: dict[str, Any]) -> str:
        return sse_event("content_block_delta", {"index": self.index, "delta": delta})

    def finish(self) -> list[str]:
        """The closing events: the open block's stop, message_delta, message_stop."""
        events = self._close()
        reason, sequence = stop_reason_of(self.finish_reason, self.matched_stop, self.tool_called)
        events.append(
            sse_event(
                "message_delta",
                {
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": {
                        "input_tokens": self.input_tokens,
                        "output_tokens": self.output_tokens,
                    },
                },
            )
        )
        events.append(sse_event("message_stop", {}))
        return events


def error_event(error_type: str, message: str) -> str:
    return sse_event("error", {"error": {"type": error_type, "message": message}})


async def convert_chat_stream(
    generator: AsyncGenerator[str, None], model: str
) -> AsyncGenerator[str, None]:
    """Anthropic's events for a chat SSE stream ("data: {...}\\n\\n" frames,
    an error frame `{"error": {...}}`, then "data: [DONE]")."""
    converter = MessageStreamConverter(model)
    try:
        async for frame in generator:
            data = frame.strip().removeprefix("data:").strip()
            if not data:
                continue
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            error = chunk.get("error")
            if error:
                code = error.get("code") if isinstance(error, dict) else None
                error_type = anthropic_error_type(code if isinstance(code, int) else 500)
                message = error.get("message", "") if isinstance(error, dict) else str(error)
                yield error_event(error_type, message)
                return
            for event in converter.feed(chunk):
                yield event
        if not converter.started:
            for event in converter.start("", None):
                yield event
        for event in converter.finish():
            yield event
    finally:
        await generator.aclose()
