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
    from vllm.tokenizers.protocol import TokenizerLike

_SEPARATORS = re.compile(r"[\s;]*")
# How every JSON object starts (a cheap first check before partial_json_parser).
_OBJECT_START = re.compile(r"\{\s*(?:\"|\}|\Z)")


class Llama3JsonToolParser(BufferedToolParser):
    bot_token = "<|python_tag|>"

    def __init__(self, tokenizer: TokenizerLike) -> None:
        super().__init__(tokenizer)
        # Where the last streaming parse got to with decisions no longer
        # text can change: (its text, position, in a run, content, calls).
        # The next step resumes there, so a long output is not re-read.
        self._resume: tuple[str, int, bool, str, list[tuple[str, str]]] = ("", 0, True, "", [])

    def parse_text(
        self, text: str, final: bool, request: ChatCompletionRequest | None
    ) -> ParsedToolText:
        out = ParsedToolText()
        pos: int | None = 0
        in_run = True  # at the start, and after a call: separators may be dropped
        seen, r_pos, r_run, r_content, r_calls = self._resume
        if text.startswith(seen):
            pos, in_run, out.content, out.calls = r_pos, r_run, r_content, list(r_calls)
        while pos is not None and pos < len(text):
            if not final:
                self._resume = (text, pos, in_run, out.content, list(out.calls))
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
        decided = self._decide_brace(text, start, final)
        if decided is None:
            return None, True  # may still become a call
        end, call = decided
        if call is None:
            out.content += text[run_start:end]
            return end, False
        out.calls.append(call)
        return end, True

    def _decide_brace(
        self, text: str, start: int, final: bool
    ) -> tuple[int, tuple[str, str] | None] | None:
        """(where the object or lone brace ends, its call if it is one), or
        None while undecided."""
        try:
            obj, end = STRICT_JSON.raw_decode(text, start)
            return end, _as_call(obj)
        except ValueError:
            if not final and _OBJECT_START.match(text, start) and is_json_prefix(text[start:]):
                return None
            return start + 1, None  # a lone brace


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
