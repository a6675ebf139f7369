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
"required" call's `arguments` are its parameters re-serialized (json.dumps);
`tools: []` is a 400.

Differences from upstream, on purpose:
- A named tool without `parameters` is constrained to an empty-parameter
  object, as "required" does (upstream leaves that output unconstrained).
- "required" output cut short (max_tokens, a stop string) keeps its complete
  calls, with the engine's finish_reason; output that is not the array is
  `content` with no tool calls (upstream: an error after generating).
- `parallel_tool_calls: false` adds `maxItems: 1` to the "required" schema
  (upstream generates every call and drops all but the first).
- Streaming "required" is `RequiredToolParser`, a tool parser on the same
  re-parsing machinery as the "auto" parsers (upstream: partial_json_parser
  in serving_chat.py): each call is sent whole once its object is complete,
  with the same arguments text as the non-streamed answer; index = the
  call's position in the array, as upstream. A named tool's deltas have
  index 0 (its position in tool_calls; older upstream used the choice index).
"""

from __future__ import annotations

import copy
import json
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
from vllm.tool_parsers.utils import BufferedToolParser, ParsedToolText, dump_arguments

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
    """A named tool's non-streamed message and finish_reason: the generated
    text is the arguments. `echo` (the echoed last message, or "") is the
    content."""
    name = named_tool(request)
    assert name is not None
    call = ToolCall(function=FunctionCall(name=name, arguments=text))
    return ChatMessage(role=role, content=echo, tool_calls=[call]), engine_reason


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


def tool_call_stream(request: ChatCompletionRequest) -> NamedToolStream | None:
    """A fresh per-choice delta maker for a named tool, else None."""
    name = named_tool(request)
    return NamedToolStream(name) if name is not None else None


class RequiredToolParser(BufferedToolParser):
    """tool_choice "required": reads the constrained output
    `[{"name": ..., "parameters": ...}, ...]` with the tool parsers' streaming
    machinery (vllm/tool_parsers/utils.py), as one more tool parser. A call is
    streamed (id, name and arguments in one delta) once its object is
    complete; its arguments are the parameters re-serialized
    (`dump_arguments`, upstream's json.dumps) streamed and not, so the two
    agree exactly. An array cut short (max_tokens, a stop string) keeps its
    complete calls; output that is not the array is content."""

    def parse_text(
        self, text: str, final: bool, request: ChatCompletionRequest | None
    ) -> ParsedToolText:
        items = _complete_items(text)
        if items is None:  # not the array: content (sent when the output ends)
            return ParsedToolText(content=text if final else "")
        return ParsedToolText(
            calls=[(item["name"], dump_arguments(item["parameters"])) for item in items]
        )


def _complete_items(text: str) -> list[dict[str, Any]] | None:
    """The complete call objects at the start of the (maybe unfinished) JSON
    array `text`; None when `text` cannot be that array."""
    decoder = json.JSONDecoder()
    pos = len(text) - len(text.lstrip())
    if pos == len(text):
        return []  # nothing yet
    if text[pos] != "[":
        return None
    items: list[dict[str, Any]] = []
    pos += 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        try:
            item, pos = decoder.raw_decode(text, pos)
        except ValueError:
            return items  # the end, or an item still being written
        if not (isinstance(item, dict) and isinstance(item.get("name"), str)):
            return items
        if "parameters" not in item:
            return items
        items.append(item)
