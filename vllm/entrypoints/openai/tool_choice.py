"""`tool_choice` "required" and named tools on /v1/chat/completions, built on
structured outputs (upstream: ChatCompletionRequest._get_json_schema_from_tool
in protocol.py, the tool-choice branches of serving_chat.py).

- A named tool (`{"type": "function", "function": {"name": N}}`): the output
  is constrained to N's `parameters` schema and becomes one tool call of N
  whose `arguments` is the generated text.
- "required": the output is constrained to a JSON array of at least one
  `{"name": <a tool's name>, "parameters": <that tool's schema>}`; each item
  becomes a tool call.

The message's `content` is "" (upstream). finish_reason (upstream, as OpenAI):
"tool_calls" for "required" when the engine stopped at the end of the JSON,
the engine's own reason ("stop", "length") for a named tool. As upstream, a
"required" call's non-streamed `arguments` are its parameters re-serialized
(json.dumps), the streamed ones the generated text; `tools: []` is a 400.

Differences from upstream, on purpose:
- A named tool without `parameters` is constrained to an empty-parameter
  object, as "required" does (upstream leaves that output unconstrained).
- "required" output that is not the array (only when generation was cut
  short: max_tokens, a stop string) is returned as `content` with no tool
  calls and the engine's finish_reason, not an error after generating.
- `parallel_tool_calls: false` adds `maxItems: 1` to the "required" schema
  (upstream generates every call and drops all but the first).
- Streaming "required" parses the JSON incrementally with a scanner (upstream:
  partial_json_parser): a call's first delta (id, type, name) is sent once its
  `parameters` value starts, then argument text as it arrives; index = the
  call's position in the array, as upstream. A named tool's deltas have
  index 0 (its position in tool_calls; older upstream used the choice index).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from vllm.entrypoints.openai.protocol import (
    ChatCompletionNamedToolChoiceParam,
    ChatCompletionRequest,
    ChatCompletionToolsParam,
    ChatMessage,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    ToolCall,
    make_tool_call_id,
)
from vllm.exceptions import VLLMValidationError

# Upstream's schema for a tool without `parameters`: no arguments, i.e. "{}".
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def named_tool(request: ChatCompletionRequest) -> str | None:
    """The tool a named tool_choice forces, else None."""
    choice = request.tool_choice
    return choice.function.name if isinstance(choice, ChatCompletionNamedToolChoiceParam) else None


def is_forced(request: ChatCompletionRequest) -> bool:
    """tool_choice "required" or a named tool: the output is tool calls."""
    return request.tool_choice == "required" or named_tool(request) is not None


def check_tool_choice(request: ChatCompletionRequest, enable_auto_tools: bool) -> None:
    """Refuse what upstream refuses (400s), before anything is rendered."""
    choice = request.tool_choice
    if request.tools is not None and not request.tools:
        raise VLLMValidationError(
            "`tools` must not be an empty array. Either provide at "
            "least one tool or omit the field entirely.",
            parameter="tools",
        )
    if choice is None and request.tools:
        choice = "auto"  # OpenAI's default when tools are given
    if choice not in (None, "none") and not request.tools:
        raise VLLMValidationError(
            "When using `tool_choice`, `tools` must be set.", parameter="tool_choice"
        )
    if choice == "auto" and not enable_auto_tools:
        raise VLLMValidationError(
            '"auto" tool choice requires --enable-auto-tool-choice and '
            "--tool-call-parser to be set",
            parameter="tool_choice",
        )
    if not is_forced(request):
        return
    name = named_tool(request)
    assert request.tools is not None  # checked above
    if name is not None and all(t.function.name != name for t in request.tools):
        raise VLLMValidationError(
            "The tool specified in `tool_choice` does not match any of the specified `tools`",
            parameter="tool_choice",
        )
    constrained = request.structured_outputs is not None or (
        request.response_format is not None and request.response_format.type != "text"
    )
    if constrained:
        # Both would constrain the same output.
        raise VLLMValidationError(
            "You can only either use constraints for structured outputs or tools, not both.",
            parameter="tool_choice",
        )


def forced_tool_schema(request: ChatCompletionRequest) -> dict[str, Any] | None:
    """The JSON schema a "required" or named tool_choice constrains the output
    to (upstream: _get_json_schema_from_tool); None otherwise."""
    if not request.tools or request.tool_choice in (None, "none", "auto"):
        return None
    name = named_tool(request)
    if name is not None:
        tool = next(t for t in request.tools if t.function.name == name)
        return tool.function.parameters or dict(_EMPTY_PARAMETERS)
    # "required". The tools' "$defs" move to the top of the schema, where the
    # "#/$defs/..." references of every tool resolve (copies: the request's
    # tools are also rendered into the prompt).
    params = [copy.deepcopy(t.function.parameters or _EMPTY_PARAMETERS) for t in request.tools]
    defs: dict[str, Any] = {}
    for schema in params:
        for def_name, def_schema in (schema.pop("$defs", None) or {}).items():
            if def_name in defs and defs[def_name] != def_schema:
                raise VLLMValidationError(
                    f"Tool definition '{def_name}' has multiple schemas, which is not supported.",
                    parameter="tools",
                )
            defs[def_name] = def_schema
    schema = {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "anyOf": [_call_schema(tool, p) for tool, p in zip(request.tools, params)],
        },
    }
    if request.parallel_tool_calls is False:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def _call_schema(tool: ChatCompletionToolsParam, parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "properties": {
            "name": {"type": "string", "enum": [tool.function.name]},
            "parameters": parameters,
        },
        "required": ["name", "parameters"],
    }


def finish_reason(
    request: ChatCompletionRequest, engine_reason: str | None, called: bool
) -> str | None:
    """ "tool_calls" when "required" produced calls and the engine stopped at
    the end of them; else the engine's reason."""
    if called and request.tool_choice == "required" and engine_reason == "stop":
        return "tool_calls"
    return engine_reason


def response_message(
    request: ChatCompletionRequest, role: str, text: str, echo: str, engine_reason: str | None
) -> tuple[ChatMessage, str | None]:
    """A non-streamed choice's message and finish_reason. `echo` (the echoed
    last message, or "") starts the content."""
    name = named_tool(request)
    if name is not None:
        call = ToolCall(function=FunctionCall(name=name, arguments=text))
        return ChatMessage(role=role, content=echo, tool_calls=[call]), engine_reason
    calls = _parse_required(text) if request.tool_choice == "required" else None
    if calls is None:
        return ChatMessage(role=role, content=echo + text), engine_reason
    return (
        ChatMessage(role=role, content=echo, tool_calls=calls),
        finish_reason(request, engine_reason, called=True),
    )


def _parse_required(text: str) -> list[ToolCall] | None:
    """The tool calls of a "required" output; None if it is not the array."""
    try:
        items = json.loads(text)
    except ValueError:
        return None
    if (
        not isinstance(items, list)
        or not items
        or not all(
            isinstance(i, dict) and isinstance(i.get("name"), str) and "parameters" in i
            for i in items
        )
    ):
        return None
    return [
        ToolCall(
            function=FunctionCall(
                name=i["name"], arguments=json.dumps(i["parameters"], ensure_ascii=False)
            )
        )
        for i in items
    ]


class NamedToolStream:
    """Streaming deltas of a named tool: the generated text is the arguments."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.called = False

    def delta(self, text: str) -> DeltaMessage | None:
        if self.called and not text:
            return None
        if not self.called:
            self.called = True
            call = DeltaToolCall(
                id=make_tool_call_id(),
                type="function",
                index=0,
                function=DeltaFunctionCall(name=self.name, arguments=text),
            )
        else:
            call = DeltaToolCall(index=0, function=DeltaFunctionCall(arguments=text))
        return DeltaMessage(tool_calls=[call])


@dataclass
class _Call:
    """One item of the "required" array while it streams."""

    index: int
    key: str | None = None  # the key whose value is being read
    name_raw: str | None = None  # the JSON text inside the name's quotes
    args_start_depth: int | None = None  # set while inside the parameters value
    args: str = ""  # parameters text not yet sent
    args_started: bool = False
    sent_header: bool = False
    args_done: bool = False


@dataclass
class RequiredToolStream:
    """Streaming deltas of tool_choice "required": scans the constrained
    `[{"name": ..., "parameters": ...}, ...]` text character by character.

    Depth 1 is inside the array, 2 inside a call object; the parameters value
    starts after `"parameters":` at depth 2 and ends when its text closes
    (a scalar at the `,` or `}` that follows it at depth 2)."""

    called: bool = False
    _depth: int = 0
    _in_string: bool = False
    _escape: bool = False
    _token: str = ""  # a key or name string being read at depth 2
    _expect_key: bool = False
    _call: _Call | None = None
    _num_calls: int = 0
    _out: list[DeltaToolCall] = field(default_factory=list)

    def delta(self, text: str) -> DeltaMessage | None:
        for ch in text:
            self._feed(ch)
        self._flush()
        out, self._out = self._out, []
        return DeltaMessage(tool_calls=out) if out else None

    def _feed(self, ch: str) -> None:
        call = self._call
        in_args = call is not None and call.args_start_depth is not None
        if in_args and not self._args_char(ch):
            return
        if self._in_string:
            self._string_char(ch, collect=not in_args and self._depth == 2)
            return
        if ch == '"':
            self._in_string, self._token = True, ""
        elif ch in "[{":
            self._depth += 1
            if ch == "{" and self._depth == 2:
                self._flush()  # what is left of the previous call
                self._call = _Call(index=self._num_calls)
                self._num_calls += 1
                self._expect_key = True
        elif ch in "]}":
            self._depth -= 1
        elif ch == "," and self._depth == 2:
            self._expect_key = True
        elif ch == ":" and self._depth == 2 and call is not None:
            call.args_start_depth = self._depth if call.key == "parameters" else None

    def _args_char(self, ch: str) -> bool:
        """Add `ch` to the parameters text; False once it is consumed there."""
        call = self._call
        assert call is not None and call.args_start_depth is not None
        if not call.args_started and ch in " \t\r\n":
            return False  # whitespace before the value
        at_value_level = self._depth == call.args_start_depth and not self._in_string
        if at_value_level and call.args_started and ch in ",}":
            call.args_start_depth, call.args_done = None, True  # a scalar ended
            return True
        call.args += ch
        call.args_started = True
        if self._in_string:
            self._string_char(ch, collect=False)
        elif ch == '"':
            self._in_string = True
        elif ch in "[{":
            self._depth += 1
        elif ch in "]}":
            self._depth -= 1
        closed = not self._in_string and self._depth == call.args_start_depth and ch in '"]}'
        if closed:
            call.args_start_depth, call.args_done = None, True
        return False

    def _string_char(self, ch: str, collect: bool) -> None:
        if self._escape:
            self._escape = False
        elif ch == "\\":
            self._escape = True
        elif ch == '"':
            self._in_string = False
            if collect:
                self._end_token()
            return
        if collect:
            self._token += ch

    def _end_token(self) -> None:
        call = self._call
        if call is None:
            return
        if self._expect_key:
            call.key, self._expect_key = self._token, False
        elif call.key == "name":
            call.name_raw = self._token

    def _flush(self) -> None:
        call = self._call
        if call is None or call.name_raw is None:
            return
        if not call.sent_header:
            if call.args_start_depth is None and not call.args_done:
                return  # wait for the parameters to start (upstream does too)
            call.sent_header = self.called = True
            self._out.append(
                DeltaToolCall(
                    id=make_tool_call_id(),
                    type="function",
                    index=call.index,
                    function=DeltaFunctionCall(
                        name=json.loads(f'"{call.name_raw}"'), arguments=call.args
                    ),
                )
            )
        elif call.args:
            self._out.append(
                DeltaToolCall(index=call.index, function=DeltaFunctionCall(arguments=call.args))
            )
        call.args = ""


def tool_call_stream(request: ChatCompletionRequest) -> NamedToolStream | RequiredToolStream | None:
    """A fresh per-choice delta maker for a forced tool choice, else None."""
    name = named_tool(request)
    if name is not None:
        return NamedToolStream(name)
    if request.tool_choice == "required":
        return RequiredToolStream()
    return None
