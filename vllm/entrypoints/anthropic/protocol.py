"""Bodies of the Anthropic Messages API (upstream: vllm/entrypoints/anthropic/protocol.py).

Requests are validated strictly, as Anthropic's own API does: an unknown
field is a 400 naming it ("Extra inputs are not permitted"), and so is a
field of Anthropic's API that this server does not implement (`container`,
`mcp_servers`, `output_config`, server tools, image and document blocks...),
rather than being accepted and silently ignored. `cache_control` (a
prompt-caching hint) is accepted wherever Anthropic allows it: vLLM's
automatic prefix caching needs no hint. `metadata.user_id` becomes the chat
request's `user`.

A content block is one model with a `type` (upstream's shape); each type
takes only its own fields (a `tool_use` block with `text` is a 400).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from vllm.entrypoints.openai.protocol_base import (
    MAX_PROMPTS_PER_REQUEST,
    StrictBool,
    StrictFloat,
    StrictInt,
)

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]

# Fields of Anthropic's Messages API that this server does not implement: a
# request that sets one is refused with a 400 naming it.
UNSUPPORTED_REQUEST_FIELDS = frozenset(
    {
        "container",
        "context_management",
        "diagnostics",
        "inference_geo",
        "mcp_servers",
        "output_config",
        "output_format",
        "service_tier",
        "speed",
        "user_profile_id",
        "workspace_id",
    }
)


# Anthropic's error type per HTTP status (its API's; 529 is its "overloaded").
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error_type(status: int | None) -> str:
    """Anthropic's `error.type` for an HTTP status."""
    if status in _ERROR_TYPES:
        return _ERROR_TYPES[status]
    return "api_error" if status is None or status >= 500 else "invalid_request_error"


class AnthropicBaseModel(BaseModel):
    """Unknown fields are refused (Anthropic's API does the same)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class AnthropicError(AnthropicBaseModel):
    """`error` of Anthropic's envelope: `type` is Anthropic's error type
    (invalid_request_error, not_found_error, api_error, overloaded_error...)."""

    type: str
    message: str


class AnthropicErrorResponse(AnthropicBaseModel):
    """`{"type": "error", "error": {"type": ..., "message": ...}}`."""

    type: Literal["error"] = "error"
    error: AnthropicError


class AnthropicUsage(AnthropicBaseModel):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None

    @model_serializer(mode="wrap")
    def _drop_absent(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class AnthropicContentBlock(AnthropicBaseModel):
    """One content block: text, tool_use, tool_result or thinking.

    image, document and redacted_thinking blocks are Anthropic's too, and
    refused here by name (this server is text-only; redacted thinking is
    Anthropic's encrypted reasoning, which no local model can read)."""

    FIELDS_BY_TYPE: ClassVar[dict[str, frozenset[str]]] = {
        "text": frozenset({"type", "text", "cache_control"}),
        "tool_use": frozenset({"type", "id", "name", "input", "cache_control"}),
        "tool_result": frozenset({"type", "tool_use_id", "content", "is_error", "cache_control"}),
        "thinking": frozenset({"type", "thinking", "signature"}),
    }

    # Any string: an unsupported type gets a 400 that names it (check_fields_of_type).
    type: str
    text: str | None = None
    # image / document (refused by check_fields_of_type, with their type's name)
    source: dict[str, Any] | None = None
    # tool_use
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    # tool_result
    tool_use_id: str | None = None
    content: str | Annotated[list[AnthropicContentBlock], Field(fail_fast=True)] | None = None
    is_error: StrictBool | None = None
    # thinking
    thinking: str | None = None
    signature: str | None = None
    cache_control: dict[str, Any] | None = None

    @model_validator(mode="after")
    def check_fields_of_type(self) -> AnthropicContentBlock:
        allowed = self.FIELDS_BY_TYPE.get(self.type)
        if allowed is None:
            raise ValueError(
                f"content blocks of type '{self.type}' are not supported by this server "
                f"(supported: {', '.join(self.FIELDS_BY_TYPE)})"
            )
        extra = sorted(self.model_fields_set - allowed)
        if extra:
            raise ValueError(f"a '{self.type}' block does not take {', '.join(extra)}")
        required = {
            "text": ("text",),
            "tool_use": ("id", "name", "input"),
            "tool_result": ("tool_use_id",),
            "thinking": ("thinking",),
        }[self.type]
        missing = [name for name in required if getattr(self, name) is None]
        if missing:
            raise ValueError(f"a '{self.type}' block needs {', '.join(missing)}")
        return self

    @model_serializer(mode="wrap")
    def _drop_absent(self, handler: Any) -> dict[str, Any]:
        # Each block carries its own type's fields only (Anthropic's shapes).
        return {k: v for k, v in handler(self).items() if v is not None}


class AnthropicMessage(AnthropicBaseModel):
    role: Literal["user", "assistant"]
    content: str | Annotated[list[AnthropicContentBlock], Field(min_length=1, fail_fast=True)]


class AnthropicTool(AnthropicBaseModel):
    """A client tool; Anthropic's server tools (bash, web search...) have a
    `type` other than "custom" and are refused."""

    type: Literal["custom"] | None = None
    name: str = Field(min_length=1, max_length=128, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    input_schema: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class AnthropicToolChoice(AnthropicBaseModel):
    """auto (the default with tools), any (some tool), tool (the named one), none."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: StrictBool | None = None

    @model_validator(mode="after")
    def check_name(self) -> AnthropicToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError("tool_choice.name is required when tool_choice.type is 'tool'")
        if self.type != "tool" and self.name is not None:
            raise ValueError("tool_choice.name is only allowed when tool_choice.type is 'tool'")
        if self.type == "none" and self.disable_parallel_tool_use is not None:
            raise ValueError("disable_parallel_tool_use does not apply to tool_choice 'none'")
        return self


class AnthropicMetadata(AnthropicBaseModel):
    user_id: str | None = None


class AnthropicSystemBlock(AnthropicBaseModel):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None


class AnthropicThinkingConfig(AnthropicBaseModel):
    """`thinking`: whether the model reasons first. It becomes the chat
    template's `enable_thinking` (Qwen3-style templates and reasoning parsers
    read it); `budget_tokens` is checked (below max_tokens, as Anthropic) but
    not enforced: logged as ignored."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: StrictInt | None = Field(default=None, ge=1)


class AnthropicPromptRequest(AnthropicBaseModel):
    """What a Messages request and a count_tokens request share: the prompt."""

    model: str = Field(min_length=1)
    messages: Annotated[
        list[AnthropicMessage],
        Field(min_length=1, max_length=MAX_PROMPTS_PER_REQUEST, fail_fast=True),
    ]
    system: str | Annotated[list[AnthropicSystemBlock], Field(fail_fast=True)] | None = None
    tools: Annotated[list[AnthropicTool], Field(fail_fast=True)] | None = None
    tool_choice: AnthropicToolChoice | None = None
    cache_control: dict[str, Any] | None = None
    thinking: AnthropicThinkingConfig | None = None
    # vLLM's extra (upstream's): keyword arguments of the chat template.
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def refuse_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            names = sorted(k for k in data if k in UNSUPPORTED_REQUEST_FIELDS)
            if names:
                raise ValueError(f"{', '.join(names)}: not supported by this server's Messages API")
        return data


class AnthropicMessagesRequest(AnthropicPromptRequest):
    """`POST /v1/messages`."""

    max_tokens: StrictInt = Field(ge=1)
    metadata: AnthropicMetadata | None = None
    stop_sequences: Annotated[list[str], Field(fail_fast=True)] | None = None
    stream: StrictBool | None = False
    temperature: StrictFloat | None = Field(default=None, ge=0.0)
    top_k: StrictInt | None = Field(default=None, ge=1)
    top_p: StrictFloat | None = Field(default=None, gt=0.0, le=1.0)

    @model_validator(mode="after")
    def check_thinking_budget(self) -> AnthropicMessagesRequest:
        budget = self.thinking.budget_tokens if self.thinking is not None else None
        if budget is not None and budget >= self.max_tokens:
            raise ValueError("thinking.budget_tokens must be less than max_tokens")
        return self


class AnthropicCountTokensRequest(AnthropicPromptRequest):
    """`POST /v1/messages/count_tokens`."""


class AnthropicCountTokensResponse(AnthropicBaseModel):
    input_tokens: int


class AnthropicMessagesResponse(AnthropicBaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    content: list[AnthropicContentBlock]
    model: str
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: AnthropicUsage


class AnthropicDelta(AnthropicBaseModel):
    """`delta` of content_block_delta (text / input_json / thinking) and
    message_delta (stop_reason, stop_sequence) events."""

    type: Literal["text_delta", "input_json_delta", "thinking_delta", "signature_delta"] | None = (
        None
    )
    text: str | None = None
    partial_json: str | None = None
    thinking: str | None = None
    signature: str | None = None
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None


class AnthropicStreamEvent(AnthropicBaseModel):
    """One SSE event; its `type` is also the SSE `event:` name."""

    type: Literal[
        "message_start",
        "message_delta",
        "message_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "ping",
        "error",
    ]
    message: AnthropicMessagesResponse | None = None
    index: int | None = None
    content_block: AnthropicContentBlock | None = None
    delta: AnthropicDelta | None = None
    usage: AnthropicUsage | None = None
    error: AnthropicError | None = None
