"""`/v1/messages` served by the chat path (upstream:
vllm/entrypoints/anthropic/serving_messages.py, `AnthropicServingMessages`).

A Messages request becomes a `ChatCompletionRequest`:

- `system` (a string or text blocks, joined) -> a leading system message;
- a text block -> text (several -> OpenAI text parts); an assistant's
  `tool_use` blocks -> its `tool_calls` (input as JSON arguments); a user's
  `tool_result` blocks -> `tool` messages (tool_call_id = tool_use_id; text
  content joined; `is_error` prefixes "Error: "), placed before the user's
  text, right after the assistant turn that made the calls; an assistant's
  `thinking` block -> its `reasoning`;
- a last message from the assistant is a prefill: the model continues it
  (continue_final_message), as Anthropic does;
- tools -> function tools (input_schema = parameters); tool_choice auto ->
  "auto", any -> "required", tool -> the named function, none -> "none";
  disable_parallel_tool_use -> parallel_tool_calls false;
- `thinking` -> the template's `enable_thinking` (disabled: false; enabled,
  adaptive: true), which Qwen3-style templates and reasoning parsers read
  (budget_tokens is not enforced: logged as ignored);
- max_tokens, stop_sequences, temperature, top_p, top_k, metadata.user_id
  (-> user), chat_template_kwargs carry over.

`OpenAIServingChat.create_chat_completion` serves it (same templates, tool
and reasoning parsers, structured outputs for forced tools); the answer is
turned back into a Message: content blocks thinking (the reasoning), text,
tool_use (arguments parsed as `input`); finish "stop" -> end_turn, or
stop_sequence with the matched string; "length" -> max_tokens; tool calls ->
tool_use. count_tokens renders the same conversation through
`OpenAIServingTokenization` (the /tokenize path).

Unlike upstream this handler holds the server's chat and tokenization
handlers instead of subclassing OpenAIServingChat: one configuration (the
flags the chat handler was built with) serves both APIs.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

import pydantic
from starlette.requests import Request

from vllm.entrypoints.anthropic.protocol import (
    AnthropicContentBlock,
    AnthropicCountTokensRequest,
    AnthropicCountTokensResponse,
    AnthropicMessage,
    AnthropicMessagesRequest,
    AnthropicMessagesResponse,
    AnthropicPromptRequest,
    AnthropicToolChoice,
    AnthropicUsage,
)
from vllm.entrypoints.anthropic.stream_converter import (
    convert_chat_stream,
    message_id,
    stop_reason_of,
)
from vllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ErrorResponse,
    TokenizeChatRequest,
    TokenizeResponse,
)
from vllm.entrypoints.openai.protocol_base import log_ignored_fields
from vllm.exceptions import VLLMValidationError

if TYPE_CHECKING:
    from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
    from vllm.entrypoints.openai.serving_tokenization import OpenAIServingTokenization

Conversation = list[dict[str, Any]]


class AnthropicServingMessages:
    """Serves `/v1/messages` and `/v1/messages/count_tokens`."""

    def __init__(
        self,
        serving_chat: OpenAIServingChat,
        serving_tokenization: OpenAIServingTokenization,
    ) -> None:
        self.serving_chat = serving_chat
        self.serving_tokenization = serving_tokenization

    async def create_messages(
        self, request: AnthropicMessagesRequest, raw_request: Request | None = None
    ) -> AsyncGenerator[str, None] | AnthropicMessagesResponse | ErrorResponse:
        """A Message, its SSE event stream, or an error body (OpenAI's, which
        the router turns into Anthropic's envelope)."""
        try:
            chat_request = to_chat_completion_request(request)
        except (ValueError, pydantic.ValidationError) as e:
            return self.serving_chat.error_from_exception(_value_error(e))
        result = await self.serving_chat.create_chat_completion(chat_request, raw_request)
        if isinstance(result, ErrorResponse):
            return result
        if isinstance(result, ChatCompletionResponse):
            return self.messages_full_converter(result)
        return self.message_stream_converter(result, request.model)

    async def count_tokens(
        self, request: AnthropicCountTokensRequest, raw_request: Request | None = None
    ) -> AnthropicCountTokensResponse | ErrorResponse:
        """The number of input tokens a Messages request with this prompt has
        (its tool_choice checked as the Messages route checks it)."""
        try:
            check_tool_choice(request)
            conversation, continue_final = convert_conversation(request)
            tokenize_request = TokenizeChatRequest.model_validate(
                {
                    "model": request.model,
                    "messages": conversation,
                    "tools": convert_tools(request),
                    "add_generation_prompt": not continue_final,
                    "continue_final_message": continue_final,
                    "chat_template_kwargs": chat_template_kwargs(request),
                }
            )
        except (ValueError, pydantic.ValidationError) as e:
            return self.serving_chat.error_from_exception(_value_error(e))
        result = await self.serving_tokenization.create_tokenize(tokenize_request)
        if isinstance(result, TokenizeResponse):
            return AnthropicCountTokensResponse(input_tokens=result.count)
        return result

    @staticmethod
    def messages_full_converter(response: ChatCompletionResponse) -> AnthropicMessagesResponse:
        """The Message of a (one-choice) chat response."""
        choice = response.choices[0]
        message = choice.message
        content: list[AnthropicContentBlock] = []
        reasoning = getattr(message, "reasoning", None)
        if reasoning:
            content.append(AnthropicContentBlock(type="thinking", thinking=reasoning, signature=""))
        if message.content:
            content.append(AnthropicContentBlock(type="text", text=message.content))
        tool_called = False
        for call in message.tool_calls:
            arguments = _tool_input(call.function.arguments)
            if arguments is None:  # not a JSON object: shown as text, not dropped
                text = f"{call.function.name}({call.function.arguments})"
                content.append(AnthropicContentBlock(type="text", text=text))
                continue
            tool_called = True
            content.append(
                AnthropicContentBlock(
                    type="tool_use", id=call.id, name=call.function.name, input=arguments
                )
            )
        if not content:
            content.append(AnthropicContentBlock(type="text", text=""))
        reason, sequence = stop_reason_of(choice.finish_reason, choice.stop_reason, tool_called)
        return AnthropicMessagesResponse(
            id=message_id(response.id),
            content=content,
            model=response.model,
            stop_reason=reason,
            stop_sequence=sequence,
            usage=AnthropicUsage(
                input_tokens=response.usage.prompt_tokens,
                output_tokens=response.usage.completion_tokens or 0,
            ),
        )

    def message_stream_converter(
        self, generator: AsyncGenerator[str, None], model: str
    ) -> AsyncGenerator[str, None]:
        """Anthropic's SSE events for the chat stream (stream_converter.py)."""
        return convert_chat_stream(generator, model)


def _value_error(e: Exception) -> Exception:
    """A pydantic error of the translated request, as a 400 with its message."""
    if isinstance(e, pydantic.ValidationError):
        first = e.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ()))
        return VLLMValidationError(f"{where}: {first.get('msg', '')}", parameter=where or None)
    return e


def _tool_input(arguments: str) -> dict[str, Any] | None:
    try:
        value = json.loads(arguments)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def to_chat_completion_request(request: AnthropicMessagesRequest) -> ChatCompletionRequest:
    """The chat request that serves `request` (ValueError: refused)."""
    conversation, continue_final = convert_conversation(request)
    body: dict[str, Any] = {
        "model": request.model,
        "messages": conversation,
        "max_completion_tokens": request.max_tokens,
        "add_generation_prompt": not continue_final,
        "continue_final_message": continue_final,
        "stop": request.stop_sequences or [],
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": request.top_k,
        "chat_template_kwargs": chat_template_kwargs(request),
    }
    if request.metadata is not None and request.metadata.user_id is not None:
        body["user"] = request.metadata.user_id
    tools = convert_tools(request)
    if tools is not None:
        body["tools"] = tools
    if request.tool_choice is not None:
        body["tool_choice"] = convert_tool_choice(request.tool_choice)
        if request.tool_choice.disable_parallel_tool_use:
            body["parallel_tool_calls"] = False
    if request.stream:
        body["stream"] = True
        # Usage on every chunk: message_start carries the input tokens.
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    return ChatCompletionRequest.model_validate(body)


def chat_template_kwargs(request: AnthropicPromptRequest) -> dict[str, Any] | None:
    """The request's chat_template_kwargs; `thinking` sets `enable_thinking`
    (unless the client set it there itself)."""
    kwargs = dict(request.chat_template_kwargs or {})
    if request.thinking is not None:
        kwargs.setdefault("enable_thinking", request.thinking.type != "disabled")
        if request.thinking.budget_tokens is not None:
            log_ignored_fields(["thinking.budget_tokens"])
    return kwargs or None


def convert_tools(request: AnthropicPromptRequest) -> list[dict[str, Any]] | None:
    if request.tools is None:
        return None
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": {"type": "object", **tool.input_schema},
            },
        }
        for tool in request.tools
    ]


def check_tool_choice(request: AnthropicPromptRequest) -> None:
    """What the chat path refuses for a Messages request: a tool_choice
    without tools, a named tool that is not among them."""
    choice = request.tool_choice
    if choice is None or choice.type == "none":
        return
    names = [tool.name for tool in request.tools or []]
    if not names:
        raise VLLMValidationError(
            "When using `tool_choice`, `tools` must be set.", parameter="tool_choice"
        )
    if choice.type == "tool" and choice.name not in names:
        raise VLLMValidationError(
            f"tool_choice.name '{choice.name}' is not one of the tools", parameter="tool_choice"
        )


def convert_tool_choice(choice: AnthropicToolChoice) -> str | dict[str, Any]:
    if choice.type == "tool":
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


def convert_conversation(request: AnthropicPromptRequest) -> tuple[Conversation, bool]:
    """The chat messages, and whether the last one is an assistant prefill
    that the model continues."""
    conversation: Conversation = []
    if request.system:
        system = (
            request.system
            if isinstance(request.system, str)
            else "\n".join(block.text for block in request.system)
        )
        conversation.append({"role": "system", "content": system})
    for i, message in enumerate(request.messages):
        conversation += _convert_message(message, f"messages.{i}")
    last = request.messages[-1]
    continue_final = last.role == "assistant"
    if continue_final and conversation[-1].get("tool_calls"):
        raise VLLMValidationError(
            "The final assistant message (a prefill the model continues) cannot hold "
            "tool_use blocks: answer them with tool_result blocks in a user message.",
            parameter=f"messages.{len(request.messages) - 1}",
        )
    return conversation, continue_final


def _convert_message(message: AnthropicMessage, where: str) -> Conversation:
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    texts: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    results: Conversation = []
    reasoning: list[str] = []
    for j, block in enumerate(message.content):
        at = f"{where}.content.{j}"
        if block.type == "text":
            texts.append(block.text or "")
        elif block.type == "thinking" and message.role == "assistant":
            reasoning.append(block.thinking or "")
        elif block.type == "tool_use" and message.role == "assistant":
            tool_calls.append(
                {
                    "id": block.id,
                    "type": "function",
                    "function": {"name": block.name, "arguments": json.dumps(block.input)},
                }
            )
        elif block.type == "tool_result" and message.role == "user":
            results.append(
                {
                    "role": "tool",
                    "tool_call_id": block.tool_use_id,
                    "content": _result_text(block, at),
                }
            )
        else:
            raise VLLMValidationError(
                f"{at}: a '{block.type}' block is not allowed in a {message.role} message",
                parameter=at,
            )
    converted: dict[str, Any] = {"role": message.role}
    if len(texts) == 1:
        converted["content"] = texts[0]
    elif texts:
        converted["content"] = [{"type": "text", "text": t} for t in texts]
    if tool_calls:
        converted["tool_calls"] = tool_calls
    if reasoning:
        converted["reasoning"] = "\n".join(reasoning)
    if texts or tool_calls or reasoning:
        results.append(converted)
    return results


def _result_text(block: AnthropicContentBlock, where: str) -> str:
    """A tool_result's content as text (its text blocks, joined)."""
    content = block.content
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        parts = []
        for k, part in enumerate(content):
            if part.type != "text":
                raise VLLMValidationError(
                    f"{where}.content.{k}: a tool_result holds text blocks only here, "
                    f"not '{part.type}'",
                    parameter=f"{where}.content.{k}",
                )
            parts.append(part.text or "")
        text = "\n".join(parts)
    return f"Error: {text}" if block.is_error else text
