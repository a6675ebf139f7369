"""Output items of a response, and the stream events that build them
(upstream: vllm/entrypoints/openai/responses/streaming_events.py).

`OutputBuilder` turns chat deltas (`reasoning`, `content`, `tool_calls`, as
/v1/chat/completions produces them with the server's reasoning and tool
parsers) into Responses output items, one at a time, and the events that
announce them, each with the next `sequence_number`:

    reasoning:      response.output_item.added, response.content_part.added,
                    response.reasoning_text.delta*, response.reasoning_text.done,
                    response.content_part.done, response.output_item.done
    message:        the same with response.output_text.delta* / .done
    function_call:  response.output_item.added,
                    response.function_call_arguments.delta*,
                    response.function_call_arguments.done, response.output_item.done

A non-streamed response feeds the whole chat message as one delta and keeps
only the items, so both paths build the same output (ids aside).

Whitespace-only text that no message has started yet is held: it joins the
text that follows, is dropped when a function call comes next (the "\n"
before hermes' `<tool_call>` is no message), and is the message when the
output has nothing else.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from vllm.entrypoints.openai.responses.protocol import InputTokensDetails, ResponseUsage
from vllm.utils import random_uuid

Event = dict[str, Any]


def sse(event: Event) -> str:
    """One event in upstream's SSE framing (`event:` line, then `data:`)."""
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


@dataclass
class _OpenItem:
    kind: str  # "reasoning" | "message" | "function_call"
    item: dict[str, Any]
    output_index: int
    tool_index: int | None = None
    text: list[str] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)


class OutputBuilder:
    """Output items from chat deltas; see the module docstring."""

    def __init__(self, include_logprobs: bool = False) -> None:
        self.include_logprobs = include_logprobs
        self.items: list[dict[str, Any]] = []
        self.sequence_number = 0
        self._open: _OpenItem | None = None
        # Whitespace-only text not yet part of a message (see on_delta).
        self._pending_text = ""
        self._pending_logprobs: list[dict[str, Any]] = []

    def event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return event

    def on_delta(
        self, delta: dict[str, Any], logprobs: dict[str, Any] | None = None
    ) -> list[Event]:
        """The events of one chat delta (reasoning first, then text, then calls)."""
        events: list[Event] = []
        reasoning = delta.get("reasoning") or delta.get("reasoning_content")
        if reasoning:
            events += self._text_delta("reasoning", reasoning, None)
        content = delta.get("content")
        if content:
            entries = ((logprobs or {}).get("content") or []) if self.include_logprobs else []
            if content.isspace() and (self._open is None or self._open.kind != "message"):
                # Held: whitespace before a call (hermes' "\n<tool_call>") is no message.
                self._pending_text += content
                self._pending_logprobs += entries
            else:
                content, self._pending_text = self._pending_text + content, ""
                entries, self._pending_logprobs = self._pending_logprobs + entries, []
                events += self._text_delta("message", content, entries)
        for call in delta.get("tool_calls") or []:
            self._pending_text, self._pending_logprobs = "", []
            events += self._tool_delta(call)
        return events

    def finish(self) -> list[Event]:
        """Close the open item: its done events. Held whitespace is the
        message only when the output has nothing else."""
        if self._pending_text and self._open is None and not self.items:
            events = self._text_delta("message", self._pending_text, self._pending_logprobs)
            return events + self._close()
        return self._close()

    # ------------------------------------------------------------------

    def _text_delta(self, kind: str, text: str, logprobs: list[dict] | None) -> list[Event]:
        events = [] if self._open is not None and self._open.kind == kind else self._start(kind)
        current = self._open
        assert current is not None
        current.text.append(text)
        where = {"item_id": current.item["id"], "output_index": current.output_index}
        if kind == "reasoning":
            events.append(
                self.event("response.reasoning_text.delta", **where, content_index=0, delta=text)
            )
        else:
            current.logprobs += logprobs or []
            events.append(
                self.event(
                    "response.output_text.delta",
                    **where,
                    content_index=0,
                    delta=text,
                    logprobs=logprobs or [],
                )
            )
        return events

    def _tool_delta(self, call: dict[str, Any]) -> list[Event]:
        index = call.get("index", 0)
        function = call.get("function") or {}
        events: list[Event] = []
        current = self._open
        if current is None or current.kind != "function_call" or current.tool_index != index:
            events += self._start(
                "function_call",
                tool_index=index,
                call_id=call.get("id") or f"call_{random_uuid()}",
                name=function.get("name") or "",
            )
            current = self._open
            assert current is not None
        elif function.get("name"):
            current.item["name"] += function["name"]
        arguments = function.get("arguments")
        if arguments:
            current.text.append(arguments)
            events.append(
                self.event(
                    "response.function_call_arguments.delta",
                    item_id=current.item["id"],
                    output_index=current.output_index,
                    delta=arguments,
                )
            )
        return events

    def _start(
        self, kind: str, tool_index: int | None = None, call_id: str = "", name: str = ""
    ) -> list[Event]:
        events = self._close()
        item: dict[str, Any]
        if kind == "reasoning":
            item = {"id": f"rs_{random_uuid()}", "type": "reasoning", "summary": [], "content": []}
        elif kind == "message":
            item = {"id": f"msg_{random_uuid()}", "type": "message", "role": "assistant"}
            item["content"] = []
        else:
            item = {"id": f"fc_{random_uuid()}", "type": "function_call", "call_id": call_id}
            item.update(name=name, arguments="")
        item["status"] = "in_progress"
        self._open = _OpenItem(kind, item, len(self.items), tool_index)
        events.append(
            self.event("response.output_item.added", output_index=len(self.items), item=item)
        )
        if kind != "function_call":
            events.append(
                self.event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=len(self.items),
                    content_index=0,
                    part=self._part(kind, ""),
                )
            )
        item = dict(item)  # the added event keeps the item as it was then
        self._open.item = item
        return events

    def _part(self, kind: str, text: str, logprobs: list[dict] | None = None) -> dict[str, Any]:
        if kind == "reasoning":
            return {"type": "reasoning_text", "text": text}
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}

    def _close(self) -> list[Event]:
        current, self._open = self._open, None
        if current is None:
            return []
        text = "".join(current.text)
        item, where = current.item, {"output_index": current.output_index}
        events = []
        if current.kind == "function_call":
            item["arguments"] = text
            events.append(
                self.event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    **where,
                    name=item["name"],
                    arguments=text,
                )
            )
        else:
            part = self._part(current.kind, text, current.logprobs)
            done = "reasoning_text" if current.kind == "reasoning" else "output_text"
            extra = {} if current.kind == "reasoning" else {"logprobs": part["logprobs"]}
            events.append(
                self.event(
                    f"response.{done}.done",
                    item_id=item["id"],
                    **where,
                    content_index=0,
                    text=text,
                    **extra,
                )
            )
            events.append(
                self.event(
                    "response.content_part.done",
                    item_id=item["id"],
                    **where,
                    content_index=0,
                    part=part,
                )
            )
            item["content"] = [part]
        item["status"] = "completed"
        self.items.append(item)
        events.append(self.event("response.output_item.done", **where, item=item))
        return events


async def chat_chunks(stream: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of chat's SSE frames ("data: {...}\\n\\n"), to [DONE]."""
    async for frame in stream:
        for line in frame.splitlines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data.strip() == "[DONE]":
                return
            yield json.loads(data)


def usage_from_chat(chat_usage: dict[str, Any]) -> ResponseUsage:
    """A chat `usage` as the response's."""
    prompt = chat_usage.get("prompt_tokens") or 0
    completion = chat_usage.get("completion_tokens") or 0
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return ResponseUsage(
        input_tokens=prompt,
        input_tokens_details=InputTokensDetails(cached_tokens=cached),
        output_tokens=completion,
        total_tokens=prompt + completion,
    )
