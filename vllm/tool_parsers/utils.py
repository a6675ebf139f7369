"""Helpers shared by the tool parsers (upstream: vllm/tool_parsers/utils.py).

Upstream's JSON helpers (`find_common_prefix`, `partial_json_loads`,
`is_complete_json`, `consume_space`) and the streaming design every parser in
this package uses, `BufferedToolParser`:

Streaming by re-parsing the settled text
----------------------------------------
A parser describes its format once, in `parse_text(text, final, request)`:
the content and the complete tool calls found in `text`. With `final=True`
(the whole output) that IS the non-streamed answer. With `final=False` (the
output so far) it reports only what no later text can change: a call once
its closing marker (or the end of its JSON) is there, content up to any
marker that might still be forming. Each streaming step re-parses
`current_text` and sends the difference to what was already sent, so the
streamed deltas can only ever add to what the final parse says: they
reassemble to the non-streamed result exactly, and a call that turns out
malformed (or is cut off by max_tokens) comes back as content, never as a
half-sent call with arguments that are not JSON. The price: a call's
arguments arrive in one delta (with its id and name), when the call is
complete, rather than piece by piece.

The end of the stream: `flush_tool_call_stream`
-----------------------------------------------
Text held back while it might still become a call (a trailing `<tool_`, an
unclosed `<tool_call>{...`) is only decided by the end of the output. The
serving layer calls `flush_tool_call_stream(parser, current_text, request)`
once, after the last `extract_tool_calls_streaming` of a choice (when the
engine reports a finish_reason), and sends what it returns (content and/or
calls) in the final chunk. It calls the parser's
`finish_streaming(current_text, request)` where the parser has one (every
`BufferedToolParser`); for any other parser (plugins written against
upstream's base class) it does upstream's finish check instead: each call's
arguments as parsed (`prev_tool_call_arr[i]["arguments"]`, dumped) beyond
what was streamed (`streamed_args_for_tool[i]`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from json import JSONDecodeError
from typing import TYPE_CHECKING, Any

import partial_json_parser
from partial_json_parser.core.options import Allow

from vllm.entrypoints.openai.protocol_responses import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
    make_tool_call_id,
)
from vllm.logger import init_logger
from vllm.tool_parsers.abstract_tool_parser import ToolParser

if TYPE_CHECKING:
    from vllm.entrypoints.openai.protocol import ChatCompletionRequest
    from vllm.tokenizers.protocol import TokenizerLike

logger = init_logger(__name__)


# ----------------------------------------------------------------------
# Upstream's JSON helpers
# ----------------------------------------------------------------------


def find_common_prefix(s1: str, s2: str) -> str:
    """The longest common prefix of two strings."""
    n = 0
    for a, b in zip(s1, s2):
        if a != b:
            break
        n += 1
    return s1[:n]


def partial_json_loads(input_str: str, flags: Allow) -> tuple[Any, int]:
    """Parse a JSON value that may be unfinished (partial_json_parser) and
    may be followed by other text; returns (value, characters consumed)."""
    try:
        return partial_json_parser.loads(input_str, flags), len(input_str)
    except JSONDecodeError as e:
        if "Extra data" in e.msg:
            return json.JSONDecoder().raw_decode(input_str)
        raise


def is_complete_json(input_str: str) -> bool:
    try:
        json.loads(input_str)
        return True
    except JSONDecodeError:
        return False


def consume_space(i: int, s: str) -> int:
    """The index of the first non-whitespace character of `s` at or after `i`."""
    while i < len(s) and s[i].isspace():
        i += 1
    return i


def is_json_prefix(text: str) -> bool:
    """Whether `text` can still grow into valid JSON (partial_json_parser
    accepts every prefix of a valid JSON value)."""
    try:
        partial_json_parser.loads(text, Allow.ALL)
        return True
    except Exception:
        return False


def partial_marker_len(text: str, markers: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one
    of `markers` (text a streaming parser must hold back: it may be the start
    of a marker split across tokens)."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} does not fit a float")
    return value


# Reads a model's JSON strictly: no NaN / Infinity (Python's json accepts
# them, and would write them back out as arguments no JSON parser reads).
STRICT_JSON = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


def dump_arguments(arguments: Any) -> str:
    """A call's arguments as JSON text, the way upstream serializes them
    (`json.dumps(..., ensure_ascii=False)`: non-ASCII stays as is)."""
    return json.dumps(arguments, ensure_ascii=False)


# ----------------------------------------------------------------------
# Streaming by re-parsing
# ----------------------------------------------------------------------


@dataclass
class ParsedToolText:
    """What `BufferedToolParser.parse_text` found: the content text (in
    order) and the complete calls as (name, arguments JSON text)."""

    content: str = ""
    calls: list[tuple[str, str]] = field(default_factory=list)


class BufferedToolParser(ToolParser):
    """A tool parser that streams by re-parsing (see the module docstring).

    Subclasses implement `parse_text` only; both extract methods follow."""

    def __init__(self, tokenizer: TokenizerLike) -> None:
        super().__init__(tokenizer)
        self._sent_content = ""

    def parse_text(
        self, text: str, final: bool, request: ChatCompletionRequest | None
    ) -> ParsedToolText:
        """The content and calls in `text`. `final=False`: `text` is a prefix
        of the output; report only what no continuation can change."""
        raise NotImplementedError

    def extract_tool_calls(
        self, model_output: str, request: ChatCompletionRequest
    ) -> ExtractedToolCallInformation:
        parsed = self.parse_text(model_output, True, request)
        if not parsed.calls:
            return ExtractedToolCallInformation(
                tools_called=False, tool_calls=[], content=model_output
            )
        calls = [
            ToolCall(function=FunctionCall(name=name, arguments=args))
            for name, args in parsed.calls
        ]
        return ExtractedToolCallInformation(
            tools_called=True, tool_calls=calls, content=parsed.content or None
        )

    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request: ChatCompletionRequest,
    ) -> DeltaMessage | None:
        return self._send_new(self.parse_text(current_text, False, request))

    def finish_streaming(
        self, current_text: str, request: ChatCompletionRequest
    ) -> DeltaMessage | None:
        """The rest of the stream, once the output is complete."""
        parsed = self.parse_text(current_text, True, request)
        if not parsed.calls:
            # As extract_tool_calls: no call means the whole output is content.
            parsed = ParsedToolText(content=current_text)
        return self._send_new(parsed)

    def _send_new(self, parsed: ParsedToolText) -> DeltaMessage | None:
        """The delta from what was sent to `parsed`, and the state update."""
        content = None
        if parsed.content.startswith(self._sent_content):
            content = parsed.content[len(self._sent_content) :] or None
            self._sent_content = parsed.content
        else:  # a parser bug: the streamed content cannot be taken back
            logger.error(
                "%s: content %r does not extend what was streamed (%r)",
                type(self).__name__,
                parsed.content,
                self._sent_content,
            )
        sent = len(self.streamed_args_for_tool)
        new_calls = []
        for index, (name, args) in enumerate(parsed.calls[sent:], start=sent):
            new_calls.append(
                DeltaToolCall(
                    index=index,
                    id=make_tool_call_id(),
                    type="function",
                    function=DeltaFunctionCall(name=name, arguments=args),
                )
            )
            self.prev_tool_call_arr.append({"name": name, "arguments": json.loads(args)})
            self.streamed_args_for_tool.append(args)
            self.current_tool_id = index
            self.current_tool_name_sent = True
        if content is None and not new_calls:
            return None
        return DeltaMessage(content=content, tool_calls=new_calls)


def flush_tool_call_stream(
    parser: ToolParser, current_text: str, request: ChatCompletionRequest
) -> DeltaMessage | None:
    """What a finished stream still owes the client (see the module docstring):
    call once per choice after its last `extract_tool_calls_streaming`."""
    finish = getattr(parser, "finish_streaming", None)
    if callable(finish):
        delta: DeltaMessage | None = finish(current_text, request)
        return delta
    return _unstreamed_arguments(parser)


def _unstreamed_arguments(parser: ToolParser) -> DeltaMessage | None:
    """Upstream's finish check, for parsers without `finish_streaming`: the
    arguments of each call as parsed (`prev_tool_call_arr`) beyond what was
    streamed (`streamed_args_for_tool`)."""
    deltas = []
    for index, call in enumerate(parser.prev_tool_call_arr):
        if index >= len(parser.streamed_args_for_tool):
            break
        expected = dump_arguments(call.get("arguments", {}))
        sent = parser.streamed_args_for_tool[index]
        if len(expected) > len(sent) and expected.startswith(sent):
            rest = expected[len(sent) :]
            parser.streamed_args_for_tool[index] = expected
            deltas.append(DeltaToolCall(index=index, function=DeltaFunctionCall(arguments=rest)))
    return DeltaMessage(tool_calls=deltas) if deltas else None
