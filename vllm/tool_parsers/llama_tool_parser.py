"""Llama 3.x / 4 JSON tool calls (upstream: vllm/tool_parsers/llama_tool_parser.py).

`--tool-call-parser llama3_json` (and `llama4_json`). The model writes each
call as a JSON object `{"name": "...", "parameters": {...}}` (or
`"arguments"`), optionally after `<|python_tag|>`; several calls are
separated by `;` and/or whitespace.

As upstream, calls are found wherever a JSON object with a string `name` and
`parameters`/`arguments` appears; other JSON objects and text that does not
parse are content, and an output with no call is all content. Unlike
upstream, which drops every bit of text once a call is found, content here is
the text outside the calls: upstream's streamed result keeps prose that comes
before a call, and the streamed and non-streamed results must agree. The
separators around calls (`;`, whitespace) and `<|python_tag|>` are dropped,
so an output that is only calls has content None, as upstream.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from vllm.tool_parsers.utils import (
    STRICT_JSON,
    BufferedToolParser,
    ParsedToolText,
    dump_arguments,
    is_json_prefix,
)

if TYPE_CHECKING:
    from vllm.entrypoints.openai.protocol import ChatCompletionRequest

_SEPARATORS = re.compile(r"[\s;]*")


class Llama3JsonToolParser(BufferedToolParser):
    bot_token = "<|python_tag|>"

    def parse_text(
        self, text: str, final: bool, request: ChatCompletionRequest | None
    ) -> ParsedToolText:
        out = ParsedToolText()
        pos: int | None = 0
        in_run = True  # at the start, and after a call: separators may be dropped
        while pos is not None and pos < len(text):
            if in_run:
                pos, in_run = self._run_then_object(text, pos, final, out)
                continue
            candidates = [
                i for i in (text.find("{", pos), text.find(self.bot_token, pos)) if i >= 0
            ]
            nxt = min(candidates, default=len(text))
            rest = text[pos:nxt]
            if nxt == len(text) and not final:  # hold a tag that may be forming
                rest = rest[: len(rest) - _partial_prefix_len(rest, self.bot_token)]
            out.content += rest
            pos, in_run = nxt, True
        return out

    def _run_then_object(
        self, text: str, start: int, final: bool, out: ParsedToolText
    ) -> tuple[int | None, bool]:
        """A run of separators and `<|python_tag|>`s from `start`, then what
        follows. Once a call was found, the run is dropped; before that it is
        dropped only when a call follows it, else it is content (so that an
        output without calls is all content). Returns (where to go on, or None
        to hold; whether that is right after a call)."""
        p = start
        while True:
            match = _SEPARATORS.match(text, p)
            p = match.end() if match else p
            if not text.startswith(self.bot_token, p):
                break
            p += len(self.bot_token)
        tail = text[p:]
        if not final and self.bot_token.startswith(tail):
            return None, True  # the run may go on (or a tag is forming)
        if not tail:
            out.content += "" if out.calls else text[start:]
            return len(text), False
        if tail[0] != "{":
            if not out.calls:
                out.content += text[start:p]
            return p, False
        return self._parse_object(text, start, p, final, out)

    def _parse_object(
        self, text: str, run_start: int, start: int, final: bool, out: ParsedToolText
    ) -> tuple[int | None, bool]:
        """The `{` at `start`: a call (the run before it is dropped), other
        JSON or a lone brace (content, run included), or undecided (hold)."""
        try:
            obj, end = STRICT_JSON.raw_decode(text, start)
        except ValueError:
            if not final and is_json_prefix(text[start:]):
                return None, True  # may still become a call
            out.content += text[run_start : start + 1]
            return start + 1, False
        call = _as_call(obj)
        if call is None:
            out.content += text[run_start:end]
            return end, False
        out.calls.append(call)
        return end, True


def _partial_prefix_len(text: str, marker: str) -> int:
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


def _as_call(obj: Any) -> tuple[str, str] | None:
    """(name, arguments JSON) when `obj` is a call, else None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if "arguments" in obj:
        return obj["name"], dump_arguments(obj["arguments"])
    if "parameters" in obj:
        return obj["name"], dump_arguments(obj["parameters"])
    return None
