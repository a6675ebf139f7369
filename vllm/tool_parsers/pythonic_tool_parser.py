"""Python-list tool calls (upstream: vllm/tool_parsers/pythonic_tool_parser.py).

`--tool-call-parser pythonic` (Llama 3.2, ToolACE, ...). The model answers
with a Python list of calls, keyword arguments only, values literals:
`[get_weather(city='San Francisco', metric='celsius'), get_time()]`,
read with `ast` (never evaluated). Arguments are sent as JSON
(`json.dumps(..., ensure_ascii=False)`, as upstream: `None` -> null,
`True` -> true, tuples -> lists).

Result: an output that starts with such a list (leading whitespace allowed)
gives its calls; content is the text after the list (None when empty, as
upstream for an output that is only the list). A call that cannot be
converted (positional or `**` arguments, a value that is not a literal, a
value JSON cannot hold: bytes, sets, 1e999) is dropped and its siblings kept,
as upstream does today; a list with no good call, a list that never closes,
and any other text are all content. Streaming sends the calls when the list
closes: before that, a later sibling could still make it malformed.
"""

from __future__ import annotations

import ast
import json
import re
from typing import TYPE_CHECKING

from vllm.logger import init_logger
from vllm.tool_parsers.utils import BufferedToolParser, ParsedToolText

if TYPE_CHECKING:
    from vllm.entrypoints.openai.protocol import ChatCompletionRequest

logger = init_logger(__name__)

# What the start of a call list looks like: `[name(` (a prefix of it while
# the text is still growing).
_CALL_START = re.compile(r"\[\s*(?:[A-Za-z_]\w*\s*(?:\(|\Z)|\Z)")
_PAIRS = {"(": ")", "[": "]", "{": "}"}


class PythonicToolParser(BufferedToolParser):
    def parse_text(
        self, text: str, final: bool, request: ChatCompletionRequest | None
    ) -> ParsedToolText:
        start = len(text) - len(text.lstrip())
        if start == len(text):  # only whitespace so far
            return ParsedToolText(content=text if final else "")
        if not _CALL_START.match(text, start):
            return ParsedToolText(content=text)
        scanned = _scan_list(text, start)
        if scanned is None or isinstance(scanned, str):
            # Unclosed (wait, or content at the end) or broken brackets.
            return ParsedToolText(content=text if final or scanned else "")
        end, elements = scanned
        calls = [c for c in (_parse_call(e) for e in elements) if c is not None]
        if not calls:
            return ParsedToolText(content=text)
        return ParsedToolText(content=text[end:], calls=calls)


def _scan_list(text: str, start: int) -> tuple[int, list[str]] | str | None:
    """Find the end of the list opening at `start` (Python strings and
    brackets respected). Returns (index after `]`, the top-level element
    texts); None while it is still open; an error text if the brackets do
    not match (the list cannot become valid)."""
    stack: list[str] = []
    elements: list[str] = []
    elem_start = start + 1
    quote = ""
    i = start
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if text.startswith(quote, i):
                i, quote = i + len(quote), ""
                continue
        elif c in "'\"":
            quote = text[i : i + 3] if text[i : i + 3] in ("'''", '"""') else c
            i += len(quote)
            continue
        elif c in _PAIRS:
            stack.append(_PAIRS[c])
        elif c in ")]}":
            if not stack or stack.pop() != c:
                return f"unexpected {c!r} at {i}"
            if not stack:
                elements.append(text[elem_start:i])
                return i + 1, [e for e in elements if e.strip()]
        elif c == "," and len(stack) == 1:
            elements.append(text[elem_start:i])
            elem_start = i + 1
        i += 1
    return None


def _parse_call(source: str) -> tuple[str, str] | None:
    """(name, arguments JSON) of one `name(key=literal, ...)`, or None."""
    try:
        node = ast.parse(source.strip(), mode="eval").body
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or node.args:
            raise ValueError("not a call with keyword arguments only")
        arguments = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise ValueError("** arguments")
            arguments[kw.arg] = ast.literal_eval(kw.value)
        return node.func.id, json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as e:
        logger.debug("pythonic tool call %r dropped: %s", source, e)
        return None
