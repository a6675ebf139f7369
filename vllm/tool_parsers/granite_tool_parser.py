"""IBM Granite 3.x tool calls (upstream: vllm/tool_parsers/granite_tool_parser.py).

`--tool-call-parser granite`. The model writes `<|tool_call|>` (Granite 3.0,
a special token) or `<tool_call>` (Granite 3.1, plain text), then a JSON
array of calls: `<|tool_call|>[{"name": "...", "arguments": {...}}, ...]`;
an output that starts with the bare array is read the same way.

As upstream: every element needs a string `name` and object `arguments`
(a serialized object is read once), or the whole output is content; an
output that is only calls has content None. Beyond upstream (whose own tests
mark surrounding text as not handled yet): text before the marker and after
the array is content, in order; whitespace around the call is dropped. Only
the first marker counts. Streaming sends the calls when the array closes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.tool_parsers.utils import (
    STRICT_JSON,
    BufferedToolParser,
    ParsedToolText,
    consume_space,
    dump_arguments,
    is_json_prefix,
    partial_marker_len,
)

if TYPE_CHECKING:
    from vllm.entrypoints.openai.protocol import ChatCompletionRequest


class GraniteToolParser(BufferedToolParser):
    bot_token = "<|tool_call|>"  # Granite 3.0: a special token
    bot_string = "<tool_call>"  # Granite 3.1: text

    def parse_text(
        self, text: str, final: bool, request: ChatCompletionRequest | None
    ) -> ParsedToolText:
        markers = (self.bot_token, self.bot_string)
        start, body = self._find_start(text)
        if start < 0:  # prose (or what may still become a start)
            if final:
                return ParsedToolText(content=text)
            if not text.strip() or any(m.startswith(text.lstrip()) for m in markers):
                return ParsedToolText()
            return ParsedToolText(content=text[: len(text) - partial_marker_len(text, markers)])
        before = text[:start] if text[:start].strip() else ""
        p = consume_space(body, text)
        if p == len(text) and not final:
            return ParsedToolText(content=before)
        if p == len(text) or text[p] != "[":
            return ParsedToolText(content=text)
        try:
            array, end = STRICT_JSON.raw_decode(text, p)
        except ValueError:
            if not final and is_json_prefix(text[p:]):
                return ParsedToolText(content=before)
            return ParsedToolText(content=text)
        calls = _as_calls(array)
        if not calls:
            return ParsedToolText(content=text)
        after = text[end:] if text[end:].strip() else ""  # held, then dropped, if blank
        return ParsedToolText(content=before + after, calls=calls)

    def _find_start(self, text: str) -> tuple[int, int]:
        """(where the call part starts, where its array may start), or (-1, -1)."""
        lead = consume_space(0, text)
        if text.startswith("[", lead):
            return lead, lead
        found = [(text.find(m), m) for m in (self.bot_token, self.bot_string)]
        found = [(i, m) for i, m in found if i >= 0]
        if not found:
            return -1, -1
        i, marker = min(found)
        return i, i + len(marker)


def _as_calls(array: Any) -> list[tuple[str, str]]:
    """The calls of a parsed array, or [] when any element is not a call."""
    if not isinstance(array, list):
        return []
    calls = []
    for obj in array:
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return []
        args = obj.get("arguments")
        if isinstance(args, str):
            try:
                args = STRICT_JSON.decode(args)
            except ValueError:
                return []
        if not isinstance(args, dict):
            return []
        calls.append((obj["name"], dump_arguments(args)))
    return calls
