"""A Responses request as chat messages and a ChatCompletionRequest
(upstream: vllm/entrypoints/openai/responses/utils.py construct_input_messages).

Input items become chat messages:
- `message` (role user / system / developer / assistant; `developer` is
  rendered as `system`): string content, or parts `input_text` /
  `output_text` / `text` (as text parts; images, files and audio are a 400);
- `function_call` -> an assistant message's `tool_calls` entry (consecutive
  calls, and a call right after assistant text, share one assistant message);
- `function_call_output` -> a `tool` message with its `tool_call_id`;
- `reasoning` -> the `reasoning` of the next assistant message (templates
  that know the key render it; encrypted reasoning is a 400, as upstream).
Any other item type is a 400 naming it.

With `previous_response_id` the conversation is: the new `instructions` (as a
system message; the previous response's instructions do not carry over, as
OpenAI), the previous conversation (its input and output, reasoning dropped as
upstream does), then the new input.
"""

from __future__ import annotations

from typing import Any

from vllm.entrypoints.openai.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
from vllm.exceptions import VLLMValidationError

Message = dict[str, Any]
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_MESSAGE_ROLES = frozenset({"user", "system", "developer", "assistant"})


def _bad(message: str, param: str) -> VLLMValidationError:
    return VLLMValidationError(message, parameter=param)


def _text_of(content: Any, param: str) -> str | list[dict[str, str]]:
    """A message's content: a string, or its parts as chat text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"`{param}` must be a string or a list of content parts.", param)
    parts = []
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_image", "input_file", "input_audio"):
            raise _bad(f"`{where}`: content of type '{kind}' is not supported.", where)
        if kind not in _TEXT_PARTS and kind != "refusal":
            raise _bad(f"`{where}` must be an input_text or output_text part.", where)
        text = part.get("refusal" if kind == "refusal" else "text")
        if not isinstance(text, str):
            raise _bad(f"`{where}.text` must be a string.", where)
        parts.append({"type": "text", "text": text})
    return parts


def _require_str(item: dict[str, Any], key: str, param: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or (key != "arguments" and not value):
        raise _bad(f"`{param}.{key}` is required and must be a non-empty string.", param)
    return value


def _message(item: dict[str, Any], param: str) -> Message:
    role = item.get("role")
    if role not in _MESSAGE_ROLES:
        raise _bad(
            f"`{param}.role` must be one of user, system, developer, assistant; got {role!r}.",
            f"{param}.role",
        )
    return {
        "role": "system" if role == "developer" else role,
        "content": _text_of(item.get("content"), f"{param}.content"),
    }


def _reasoning_text(item: dict[str, Any], param: str) -> str:
    if item.get("encrypted_content"):
        raise _bad("Encrypted content is not supported.", f"{param}.encrypted_content")
    texts = []
    for key in ("content", "summary"):
        for part in item.get(key) or []:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
        if texts:  # the full reasoning text, else its summary
            break
    return "\n".join(texts)


def input_to_messages(items: list[Any]) -> list[Message]:
    """The chat messages of a list of input items (see the module docstring)."""
    messages: list[Message] = []
    reasoning: str | None = None
    # Where a function_call may join: the assistant message just built.
    open_assistant: Message | None = None
    for i, item in enumerate(items):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(f"`{param}` must be an object (an input item).", param)
        kind = item.get("type", "message")
        if kind == "message":
            msg = _message(item, param)
            if msg["role"] == "assistant" and reasoning is not None:
                msg["reasoning"], reasoning = reasoning, None
            messages.append(msg)
            open_assistant = msg if msg["role"] == "assistant" else None
        elif kind == "function_call":
            call = {
                "id": _require_str(item, "call_id", param),
                "type": "function",
                "function": {
                    "name": _require_str(item, "name", param),
                    "arguments": _require_str(item, "arguments", param),
                },
            }
            if open_assistant is None:
                open_assistant = {"role": "assistant", "content": None}
                if reasoning is not None:
                    open_assistant["reasoning"], reasoning = reasoning, None
                messages.append(open_assistant)
            open_assistant.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else _text_of(output, f"{param}.output")
            call_id = _require_str(item, "call_id", param)
            messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
            open_assistant = None
        elif kind == "reasoning":
            reasoning = _reasoning_text(item, param)
        else:
            raise _bad(
                f"`{param}.type` '{kind}' is not supported: only message, function_call, "
                "function_call_output and reasoning items are.",
                f"{param}.type",
            )
    return messages


def output_to_messages(output: list[dict[str, Any]]) -> list[Message]:
    """A response's output as the assistant turn of the next request's history
    (its text and function calls; reasoning is dropped, as upstream)."""
    text = "".join(
        part.get("text", "")
        for item in output
        if item.get("type") == "message"
        for part in item.get("content", [])
    )
    calls = [
        {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]},
        }
        for item in output
        if item.get("type") == "function_call"
    ]
    if not text and not calls:
        return []
    message: Message = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return [message]


def construct_input_messages(
    request: ResponsesRequest, history: list[Message] | None
) -> tuple[list[Message], list[Message]]:
    """(the messages to render, the conversation to store for a follow-up):
    the stored one is without the instructions."""
    new = (
        [{"role": "user", "content": request.input}]
        if isinstance(request.input, str)
        else input_to_messages(request.input)
    )
    conversation = [*(history or []), *new]
    if not conversation:
        raise _bad("`input` must not be empty.", "input")
    system = [{"role": "system", "content": request.instructions}] if request.instructions else []
    return [*system, *conversation], conversation


def convert_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Function tools (flat, Responses style) as chat tools; other tool types
    (web_search, file_search, mcp, ...) are a 400."""
    converted = []
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        kind = tool.get("type")
        if kind != "function":
            raise _bad(
                f"`{param}.type` {kind!r} is not supported: only function tools are.",
                f"{param}.type",
            )
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise _bad(f"`{param}.name` is required and must be a non-empty string.", param)
        parameters = tool.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise _bad(f"`{param}.parameters` must be a JSON schema object.", param)
        function: dict[str, Any] = {"name": name}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        if parameters is not None:
            function["parameters"] = parameters
        converted.append({"type": "function", "function": function})
    return converted


def convert_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    """ "auto" / "none" / "required", or `{"type": "function", "name": N}` as
    chat's named tool choice; hosted-tool and allowed_tools choices are a 400."""
    if isinstance(choice, str):
        return choice
    name = choice.get("name")
    if choice.get("type") != "function" or not isinstance(name, str):
        raise _bad(
            '`tool_choice` must be "auto", "none", "required" or '
            '{"type": "function", "name": ...}.',
            "tool_choice",
        )
    return {"type": "function", "function": {"name": name}}


def _response_format(request: ResponsesRequest) -> dict[str, Any] | None:
    fmt = request.text.format if request.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    schema: dict[str, Any] = {"name": fmt.name or "response", "schema": fmt.schema_}
    if fmt.strict is not None:
        schema["strict"] = fmt.strict
    return {"type": "json_schema", "json_schema": schema}


def to_chat_request(
    request: ResponsesRequest, messages: list[Message], stream: bool
) -> ChatCompletionRequest:
    """The ChatCompletionRequest that generates this response."""
    body: dict[str, Any] = {
        "model": request.model,
        "messages": messages,
        "max_completion_tokens": request.max_output_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": request.top_k,
        "logit_bias": request.logit_bias,
        "user": request.user,
        "skip_special_tokens": request.skip_special_tokens,
        "priority": request.priority,
        "cache_salt": request.cache_salt,
        "request_id": request.request_id,
        "response_format": _response_format(request),
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if request.tools:
        body["tools"] = convert_tools(request.tools)
        body["tool_choice"] = convert_tool_choice(request.tool_choice)
        body["parallel_tool_calls"] = request.parallel_tool_calls
    elif request.tool_choice not in ("auto", "none"):
        raise _bad("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if request.is_include_output_logprobs():
        body["logprobs"] = True
        body["top_logprobs"] = request.top_logprobs or 0
    return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
