"""Hermes 2 Pro / Qwen-style tool calls (upstream: vllm/tool_parsers/hermes_tool_parser.py).

`--tool-call-parser hermes`. The model writes each call as
`<tool_call>{"name": "...", "arguments": {...}}</tool_call>`; the last one may
run to the end of the output without its closing tag.

Markers are found in the text, so this works whether or not the tokenizer
has `<tool_call>` / `</tool_call>` as special tokens (upstream refuses a
tokenizer without them; SmolLM2's has none). When they are special tokens,
`adjust_request` keeps them in the detokenized text.

Result, as upstream: content is the text before the first call (None when
empty); text between and after calls is dropped; when no block parses, the
whole output is content and no call is made. Where upstream drops every call
because one block is malformed, this parser keeps the good calls and returns
the malformed block's text as content: the streamed result could not take
back calls already sent (see utils.BufferedToolParser).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm.tool_parsers.utils import (
    STRICT_JSON,
    BufferedToolParser,
    ParsedToolText,
    dump_arguments,
    partial_marker_len,
)

if TYPE_CHECKING:
    from vllm.entrypoints.openai.protocol import ChatCompletionRequest


class Hermes2ProToolParser(BufferedToolParser):
    tool_call_start_token = "<tool_call>"
    tool_call_end_token = "</tool_call>"

    def adjust_request(self, request: ChatCompletionRequest) -> ChatCompletionRequest:
        # The markers may be special tokens: keep them in the text (upstream).
        if request.tools and request.tool_choice != "none":
            request.skip_special_tokens = False
        return request

    def parse_text(
        self, text: str, final: bool, request: ChatCompletionRequest | None
    ) -> ParsedToolText:
        start, end = self.tool_call_start_token, self.tool_call_end_token
        out = ParsedToolText()
        pos = 0
        while True:
            s = text.find(start, pos)
            if s < 0:
                rest = text[pos:]
                if not final:  # hold a marker that may still be forming
                    rest = rest[: len(rest) - partial_marker_len(rest, [start])]
                self._add_content(out, rest)
                return out
            self._add_content(out, text[pos:s])
            e = text.find(end, s + len(start))
            if e < 0 and not final:
                return out  # an open call: decided when it closes
            stop = len(text) if e < 0 else e + len(end)
            inner = text[s + len(start) : len(text) if e < 0 else e]
            call = _parse_call(inner)
            if call is None:
                out.content += text[s:stop]  # a malformed block is content
            else:
                out.calls.append(call)
            if e < 0:
                return out
            pos = stop

    @staticmethod
    def _add_content(out: ParsedToolText, text: str) -> None:
        # Upstream's content is the text before the first call only.
        if not out.calls:
            out.content += text


def _parse_call(inner: str) -> tuple[str, str] | None:
    """(name, arguments JSON) of one call's JSON text, or None if malformed."""
    try:
        obj = STRICT_JSON.decode(inner)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if "arguments" not in obj:
        return None
    args = obj["arguments"]
    if isinstance(args, str):
        # Some models (Granite 4) write the arguments already serialized:
        # pass an object through once, not encoded twice.
        try:
            decoded = STRICT_JSON.decode(args)
        except ValueError:
            decoded = None
        if isinstance(decoded, dict):
            args = decoded
    return obj["name"], dump_arguments(args)
