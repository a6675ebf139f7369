"""Qwen3-Coder tool calls (upstream: vllm/tool_parsers/qwen3coder_tool_parser.py).

    content<tool_call>
    <function=NAME>
    <parameter=P>
    VALUE
    </parameter>
    </function>
    </tool_call>

The `<tool_call>` wrapper is optional; several calls may follow each other.
A parameter's value is the text between its tags less one leading and one
trailing newline, converted by the type the tool's JSON schema gives it
(request.tools), as upstream: strings stay as written; integer, number,
boolean, object and array values are parsed (a value that does not parse
stays a string); `null` is null for non-string types; a parameter the
schema does not know is a string. A parameter ends at `</parameter>`, at the
next `<parameter=` or at `</function>`.
As upstream, content is the text before the first call; the markers are
found in the text, so a tokenizer without them as special tokens works too.
While streaming, a string parameter's value is sent as it is written; other
types once the parameter is complete.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vllm.logger import init_logger
from vllm.tool_parsers._snapshot_stream import (
    CallSnapshot,
    Snapshot,
    SnapshotStreamer,
    cached_vocab,
    to_extracted,
)
from vllm.tool_parsers.abstract_tool_parser import ToolParser
from vllm.tool_parsers.utils import dump_arguments as dumps
from vllm.tool_parsers.utils import partial_marker_len

if TYPE_CHECKING:
    from vllm.entrypoints.openai.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.protocol_responses import (
        DeltaMessage,
        ExtractedToolCallInformation,
    )
    from vllm.tokenizers.protocol import TokenizerLike

logger = init_logger(__name__)

_STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")
_INT_PREFIXES = ("int", "uint", "long", "short", "unsigned")


def schema_type(schema: Any) -> str:
    """The declared type of one property schema (`anyOf`: its first
    non-null branch); "string" when none is declared."""
    if not isinstance(schema, dict):
        return "string"
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind is None and isinstance(schema.get("anyOf"), list):
        branches = [b.get("type") for b in schema["anyOf"] if isinstance(b, dict)]
        kind = next((k for k in branches if isinstance(k, str) and k != "null"), "string")
    return str(kind or "string").strip().lower()


def is_nullable(schema: Any) -> bool:
    """Whether a property schema admits null (`"type": [..., "null"]` or an
    `anyOf` branch of type null)."""
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    branches = schema.get("anyOf")
    return isinstance(branches, list) and any(
        isinstance(b, dict) and b.get("type") == "null" for b in branches
    )


def convert_param_value(value: str, kind: str, nullable: bool = False) -> Any:
    """A parameter's text as the schema type `kind` reads it (upstream's
    conversion: what does not parse stays the string)."""
    if value.lower() in ("null", "none") and (nullable or kind not in _STRING_TYPES):
        return None  # as upstream: null for non-string and nullable types
    if kind in _STRING_TYPES:
        return value
    if kind.startswith(_INT_PREFIXES):
        try:
            return int(value)
        except ValueError:
            return value
    if kind.startswith(("num", "float")):
        try:
            number = float(value)
        except ValueError:
            return value
        return int(number) if number.is_integer() else number
    if kind in ("boolean", "bool", "binary"):
        return value.lower() == "true"
    if kind in ("object", "array", "arr") or kind.startswith(("dict", "list")):
        try:
            return json.loads(value)
        except ValueError:
            pass
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value


class Qwen3CoderToolParser(ToolParser):
    """`--tool-call-parser qwen3_coder`."""

    tool_call_start_token = "<tool_call>"
    tool_call_end_token = "</tool_call>"
    tool_call_prefix = "<function="
    function_end_token = "</function>"
    parameter_prefix = "<parameter="
    parameter_end_token = "</parameter>"

    def __init__(self, tokenizer: TokenizerLike) -> None:
        super().__init__(tokenizer)
        self.tool_call_start_token_id = cached_vocab(tokenizer).get(self.tool_call_start_token)
        self.tool_call_end_token_id = cached_vocab(tokenizer).get(self.tool_call_end_token)
        self._streamer = SnapshotStreamer()

    # -- parsing ---------------------------------------------------------

    def snapshot(self, text: str, final: bool, request: ChatCompletionRequest | None) -> Snapshot:
        """Content and calls of `text` (see _snapshot_stream)."""
        start = self._first_call_start(text)
        if start < 0:
            if final:
                return Snapshot(text)
            markers = (self.tool_call_start_token, self.tool_call_prefix)
            return Snapshot(text[: len(text) - partial_marker_len(text, markers)])
        calls = self._calls(text, start, final, _tool_schemas(request))
        if not calls and final:
            return Snapshot(text)
        return Snapshot(text[:start], calls)

    def _first_call_start(self, text: str) -> int:
        """Where the first call starts (-1: none yet); a closed
        `<tool_call>...</tool_call>` without a function in it is content."""
        pos = 0
        while True:
            wrapper = text.find(self.tool_call_start_token, pos)
            bare = text.find(self.tool_call_prefix, pos)
            if wrapper < 0 or (0 <= bare < wrapper):
                return bare
            end = text.find(self.tool_call_end_token, wrapper)
            if end < 0 or 0 <= bare < end:
                return wrapper
            pos = end + len(self.tool_call_end_token)

    def _calls(
        self, text: str, pos: int, final: bool, schemas: dict[str, dict[str, Any]]
    ) -> list[CallSnapshot]:
        calls = []
        while (begin := text.find(self.tool_call_prefix, pos)) >= 0:
            name_end = text.find(">", begin)
            if name_end < 0:
                break
            name = text[begin + len(self.tool_call_prefix) : name_end].strip()
            end = text.find(self.function_end_token, name_end)
            closed = final or end >= 0
            body = text[name_end + 1 : end if end >= 0 else len(text)]
            if name and not any(c.isspace() or c in "<>" for c in name):
                props = schemas.get(name, {})
                text_args, value = self._arguments(body, closed, props)
                calls.append(CallSnapshot(name, text_args, value))
            if end < 0:
                break
            pos = end + len(self.function_end_token)
        return calls

    def _arguments(self, body: str, closed: bool, props: dict[str, Any]) -> tuple[str, Any]:
        """(arguments JSON text, value) of a function body; while the body
        may grow, the text is the stable prefix."""
        values: dict[str, Any] = {}
        pos = 0
        while (begin := body.find(self.parameter_prefix, pos)) >= 0:
            name_end = body.find(">", begin)
            if name_end < 0:
                break
            name = body[begin + len(self.parameter_prefix) : name_end].strip()
            ends = [
                i
                for i in (
                    body.find(self.parameter_end_token, name_end),
                    body.find(self.parameter_prefix, name_end),
                )
                if i >= 0
            ]
            kind = schema_type(props.get(name)) if name in props else "string"
            nullable = is_nullable(props.get(name))
            if not ends and not closed:
                raw = body[name_end + 1 :]
                markers = (self.parameter_end_token, self.parameter_prefix, self.function_end_token)
                raw = _trim_value(raw[: len(raw) - partial_marker_len(raw, markers)])
                if kind in _STRING_TYPES and not nullable:  # (null is not streamed as "nul)
                    values.setdefault(name, raw)
                break
            stop = min(ends) if ends else len(body)
            # A repeated parameter keeps its first value (upstream: the last),
            # which may already be streamed.
            values.setdefault(
                name, convert_param_value(_trim_value(body[name_end + 1 : stop]), kind, nullable)
            )
            pos = stop + (
                len(self.parameter_end_token)
                if body.startswith(self.parameter_end_token, stop)
                else 0
            )
        text = dumps(values)
        return (text if closed else text.rstrip('"]}')), values

    # -- the two entry points ---------------------------------------------

    def extract_tool_calls(
        self, model_output: str, request: ChatCompletionRequest
    ) -> ExtractedToolCallInformation:
        return to_extracted(self.snapshot(model_output, True, request), model_output)

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
        return self._streamer.step(self, self.snapshot(current_text, False, request))

    def finish_streaming(
        self, current_text: str, request: ChatCompletionRequest
    ) -> DeltaMessage | None:
        """What the stream still owes once the output is complete (called by
        utils.flush_tool_call_stream)."""
        return self._streamer.finish(self, self.snapshot(current_text, True, request), current_text)


def _trim_value(raw: str) -> str:
    """Drop one leading and one trailing newline (a value still being written
    keeps its last newline back: it may be the one that goes)."""
    if raw.startswith("\n"):
        raw = raw[1:]
    if raw.endswith("\n"):
        raw = raw[:-1]
    return raw


def _tool_schemas(request: ChatCompletionRequest | None) -> dict[str, dict[str, Any]]:
    """Tool name -> its parameters' `properties`."""
    schemas: dict[str, dict[str, Any]] = {}
    for tool in (request.tools if request is not None else None) or []:
        params = tool.function.parameters or {}
        props = params.get("properties") if isinstance(params, dict) else None
        schemas[tool.function.name] = props if isinstance(props, dict) else {}
    return schemas
