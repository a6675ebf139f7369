"""Streaming by snapshots, shared by the mistral, qwen3 and deepseek_v3 parsers.

Each of those parsers describes a model output with one function,
`snapshot(text, final)`: the content and the tool calls it holds. With
`final=True` that is the non-streamed answer. With `final=False` (the text
may still grow) the snapshot keeps only what no later text can change: the
content up to any marker that might be forming, the calls whose name is
complete, and for each call the *stable prefix* of its arguments JSON. The
stream is then just the difference between successive snapshots, so the
deltas reassemble to exactly what the last snapshot says, and never send
text a later chunk could contradict.

Arguments are re-serialized with `json.dumps(..., ensure_ascii=False)` (as
upstream does for parsed arguments). While they are incomplete,
`partial_json_parser` completes them without partial numbers or literals
(those can still change: `1` -> `1.5`), the completion is decoded strictly
(`complete_json`), and the closing quotes and brackets are held back. A
repeated key keeps its first value (json's default, the last, could replace
a value already streamed).

The end of the stream is the one thing a parser cannot see: text held back
at the very end (a trailing partial marker, a call that never parsed, the
closing `"}` of arguments cut off by max_tokens) is sent by
`finish_streaming`, which the serving layer calls once the output is complete
(vllm/tool_parsers/utils.py: flush_tool_call_stream): the difference between
the final snapshot and what was sent.

This differs from utils.BufferedToolParser (the design of the JSON-in-tags
parsers) in one way: arguments stream piece by piece, as they are written,
instead of in one delta once the call is complete. A call already streamed
cannot be taken back, so a call whose arguments break (a syntax error after
they began, or a cut-off) keeps, in both modes, its arguments as far as they
were JSON, completed (`json_arguments`); call text that never got that far
(no name, arguments that do not open an object) is content.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
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
from vllm.tool_parsers.utils import dump_arguments as dumps

if TYPE_CHECKING:
    from vllm.tool_parsers.abstract_tool_parser import ToolParser

logger = init_logger(__name__)

# What an unfinished JSON text may contribute: whole numbers / true / false /
# null only once something follows them; strings may be partial.
STABLE_ALLOW = Allow.STR | Allow.OBJ | Allow.ARR
_CLOSERS = '"]}'


@dataclass
class CallSnapshot:
    """One tool call as far as it is known: its name is always complete;
    `arguments` is the final JSON text or, while streaming, a prefix of it;
    `value` is the arguments as parsed so far (what the final flush dumps)."""

    name: str
    arguments: str
    value: Any = None
    call_id: str | None = None


@dataclass
class Snapshot:
    """What a (possibly unfinished) model output says: `content` is the text
    that is content; `calls` the tool calls, in order."""

    content: str
    calls: list[CallSnapshot] = field(default_factory=list)


_VOCABS: weakref.WeakKeyDictionary[Any, dict[str, int]] = weakref.WeakKeyDictionary()


def cached_vocab(tokenizer: Any) -> dict[str, int]:
    """`tokenizer.get_vocab()`, computed once per tokenizer: a parser is built
    per request, and a large vocabulary takes tens of milliseconds to copy."""
    try:
        vocab = _VOCABS.get(tokenizer)
    except TypeError:  # not weakly referenceable: no cache
        return tokenizer.get_vocab()
    if vocab is None:
        vocab = _VOCABS[tokenizer] = tokenizer.get_vocab()
    return vocab


def _first_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose repeated keys keep their first value (json's
    default is the last), so a value already streamed is never replaced."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        obj.setdefault(key, value)
    return obj


_DECODER = json.JSONDecoder(object_pairs_hook=_first_wins)


def decode_first_json(raw: str) -> tuple[Any, int] | None:
    """The first JSON value at the start of `raw` (after whitespace) and the
    index just past it, or None when there is no complete one."""
    start = len(raw) - len(raw.lstrip())
    try:
        value, end = _DECODER.raw_decode(raw, start)
    except json.JSONDecodeError:
        return None
    return value, end


def complete_json(text: str, allow: Allow) -> Any:
    """`text`, a JSON prefix, completed (partial_json_parser) and decoded
    strictly; raises ValueError when it is not a JSON prefix."""
    try:
        completed = partial_json_parser.ensure_json(text, allow)
    except Exception as e:  # partial_json_parser raises its own error types
        raise ValueError(str(e)) from e
    return _DECODER.decode(completed)


def is_json_prefix(text: str, allow: Allow = Allow.ALL) -> bool:
    """Whether `text` can still grow into JSON, checked by decoding its
    completion (stricter than partial_json_parser alone, which accepts e.g.
    `{"a": "b" "c`)."""
    try:
        complete_json(text, allow)
    except ValueError:
        return False
    return True


def json_prefix_len(text: str, allow: Allow = Allow.ALL) -> int:
    """Length of the longest prefix of `text` that can still grow into JSON
    (all of it, unless a syntax error breaks it; found by bisection, as a
    prefix of a broken text is broken too)."""
    if is_json_prefix(text, allow):
        return len(text)
    good, bad = 0, len(text)
    while bad - good > 1:
        mid = (good + bad) // 2
        if is_json_prefix(text[:mid], allow):
            good = mid
        else:
            bad = mid
    return good


def parse_partial_json(text: str, closed: bool, allow: Allow | None = None) -> Any:
    """`text` read as JSON as far as it is JSON: unfinished (or broken) at the
    end, it is completed (closed) or cut to what no more text can change
    (`allow` overrides what an unfinished end may contribute)."""
    if allow is None:
        allow = Allow.ALL if closed else STABLE_ALLOW
    return complete_json(text[: json_prefix_len(text, allow)], allow)


def json_arguments(raw: str, closed: bool) -> tuple[str, Any] | None:
    """Arguments JSON text for `raw`, the arguments as written so far.

    closed: no more argument text will come (the call's end was seen, or the
    output is whole); then the text is final: the first JSON object in `raw`,
    or, when the object is cut off (max_tokens) or broken by a syntax error,
    the object as far as it was JSON, completed -- the same arguments the
    stream has been sending, so the two never disagree. Not closed: the
    stable prefix of that final text. None: `raw` is not an object (the call
    is malformed), or nothing is written yet."""
    body = raw.strip()
    if not body.startswith("{"):
        return None
    whole = decode_first_json(body)
    if whole is not None and isinstance(whole[0], dict):
        return dumps(whole[0]), whole[0]
    try:
        value = parse_partial_json(body, closed)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    text = dumps(value)
    return (text if closed else text.rstrip(_CLOSERS)), value


def to_extracted(
    snapshot: Snapshot, model_output: str, make_id: Callable[[], str] = make_tool_call_id
) -> ExtractedToolCallInformation:
    """The non-streamed answer for a final snapshot: no calls -> all content."""
    if not snapshot.calls:
        return ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=model_output)
    calls = []
    for call in snapshot.calls:
        function = FunctionCall(name=call.name, arguments=call.arguments)
        calls.append(ToolCall(id=call.call_id or make_id(), function=function))
    return ExtractedToolCallInformation(
        tools_called=True, tool_calls=calls, content=snapshot.content or None
    )


class SnapshotStreamer:
    """Sends the difference between successive snapshots; the calls' state
    lives on the parser, in upstream's attributes (prev_tool_call_arr,
    streamed_args_for_tool, current_tool_id, current_tool_name_sent)."""

    def __init__(self, make_id: Callable[[], str] = make_tool_call_id) -> None:
        self.sent_content = ""
        self.make_id = make_id

    def finish(self, parser: ToolParser, snapshot: Snapshot, text: str) -> DeltaMessage | None:
        """The rest of the stream once the output is whole: `snapshot` is the
        final one (no call means all of `text` is content, as non-streamed)."""
        if not snapshot.calls:
            snapshot = Snapshot(text)
        if len(snapshot.calls) < len(parser.streamed_args_for_tool):
            logger.warning("%s: a streamed tool call turned out malformed", type(parser).__name__)
        return self.step(parser, snapshot)

    def step(self, parser: ToolParser, snapshot: Snapshot) -> DeltaMessage | None:
        content = None
        if snapshot.content.startswith(self.sent_content):
            new = snapshot.content[len(self.sent_content) :]
            if new:
                content = new
                self.sent_content = snapshot.content
        else:  # a parser bug: streamed content cannot be taken back
            logger.error("%s: content no longer extends what was streamed", type(parser).__name__)
        deltas = [
            delta
            for index, call in enumerate(snapshot.calls)
            if (delta := self._call_delta(parser, index, call)) is not None
        ]
        if content is None and not deltas:
            return None
        return DeltaMessage(content=content, tool_calls=deltas)

    def _call_delta(
        self, parser: ToolParser, index: int, call: CallSnapshot
    ) -> DeltaToolCall | None:
        if index >= len(parser.streamed_args_for_tool):
            if index != len(parser.streamed_args_for_tool):
                return None  # calls are sent in order
            parser.streamed_args_for_tool.append(call.arguments)
            parser.prev_tool_call_arr.append({"name": call.name, "arguments": call.value})
            parser.current_tool_id = index
            parser.current_tool_name_sent = True
            return DeltaToolCall(
                index=index,
                id=call.call_id or self.make_id(),
                type="function",
                function=DeltaFunctionCall(name=call.name, arguments=call.arguments or None),
            )
        if parser.prev_tool_call_arr[index].get("name") != call.name:
            return None  # a different call now holds this place: never contradict
        parser.prev_tool_call_arr[index]["arguments"] = call.value
        sent = parser.streamed_args_for_tool[index]
        if len(call.arguments) <= len(sent):
            return None  # nothing new
        if not call.arguments.startswith(sent):  # a parser bug: never contradict
            logger.error("%s: arguments no longer extend what was streamed", type(parser).__name__)
            return None
        parser.streamed_args_for_tool[index] = call.arguments
        return DeltaToolCall(
            index=index, function=DeltaFunctionCall(arguments=call.arguments[len(sent) :])
        )
