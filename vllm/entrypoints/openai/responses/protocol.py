"""Bodies of `/v1/responses` (upstream: vllm/entrypoints/openai/responses/protocol.py).

The request keeps upstream's field names and defaults. `input` items and
`tools` are plain dicts here and are checked item by item in utils.py, so
that a bad item is one 400 naming it (`input[2].call_id`), not pydantic's
error for every member of a union of item types.

Output items, parts and events are built as dicts in OpenAI's JSON shapes
(the `openai` client parses them into its types); the response object is a
model, so /openapi.json declares it.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from vllm.entrypoints.openai.protocol_base import (
    MAX_PROMPTS_PER_REQUEST,
    OpenAIBaseModel,
    StrictBool,
    StrictFloat,
    StrictInt,
)
from vllm.utils import random_uuid

# The `include` values upstream accepts; only the logprobs one changes the output.
IncludeValue = Literal[
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "message.input_image.image_url",
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
]
LOGPROBS_INCLUDE = "message.output_text.logprobs"
ResponseStatus = Literal["completed", "failed", "in_progress", "cancelled", "queued", "incomplete"]


class ResponseTextFormat(OpenAIBaseModel):
    """`text.format`: "text", "json_object" or "json_schema" (name, schema)."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    # OpenAI's key is "schema", which would shadow BaseModel.schema.
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None

    @model_validator(mode="after")
    def check_schema(self) -> ResponseTextFormat:
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError(
                '`text.format.schema` is required when `text.format.type` is "json_schema".'
            )
        return self


class ResponseTextConfig(OpenAIBaseModel):
    format: ResponseTextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class Reasoning(OpenAIBaseModel):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(OpenAIBaseModel):
    """POST /v1/responses (https://platform.openai.com/docs/api-reference/responses/create)."""

    background: StrictBool | None = False
    include: Annotated[list[IncludeValue], Field(max_length=16)] | None = None
    input: str | Annotated[list[Any], Field(max_length=MAX_PROMPTS_PER_REQUEST, fail_fast=True)]
    instructions: str | None = None
    max_output_tokens: StrictInt | None = Field(None, ge=1)
    max_tool_calls: StrictInt | None = None
    metadata: dict[str, str] | None = None
    model: str | None = None
    logit_bias: dict[str, StrictFloat] | None = None
    parallel_tool_calls: StrictBool | None = True
    previous_response_id: str | None = None
    prompt: dict[str, Any] | None = None
    reasoning: Reasoning | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] = "auto"
    store: StrictBool | None = True
    stream: StrictBool | None = False
    temperature: StrictFloat | None = None
    text: ResponseTextConfig | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] = "auto"
    tools: Annotated[list[dict[str, Any]], Field(max_length=1024)] = Field(default_factory=list)
    top_logprobs: StrictInt | None = Field(0, ge=0, le=20)
    top_p: StrictFloat | None = None
    top_k: StrictInt | None = None
    truncation: Literal["auto", "disabled"] | None = "disabled"
    user: str | None = None
    skip_special_tokens: StrictBool = True
    # --- vLLM's extras (upstream's) ---
    request_id: str = Field(default_factory=lambda: f"resp_{random_uuid()}")
    mm_processor_kwargs: dict[str, Any] | None = None
    priority: StrictInt = 0
    cache_salt: str | None = None
    enable_response_messages: StrictBool = False
    previous_input_messages: list[Any] | None = None

    @field_validator("cache_salt")
    @classmethod
    def check_cache_salt(cls, value: str | None) -> str | None:
        if value is not None and not value:
            raise ValueError("Parameter 'cache_salt' must be a non-empty string if provided.")
        return value

    @model_validator(mode="after")
    def check_background(self) -> ResponsesRequest:
        # Upstream's message (openai client tests match on it).
        if self.background and not self.store:
            raise ValueError("background can only be used when `store` is true")
        return self

    def is_include_output_logprobs(self) -> bool:
        return bool(self.include) and LOGPROBS_INCLUDE in (self.include or [])


class InputTokensDetails(OpenAIBaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(OpenAIBaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(OpenAIBaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(OpenAIBaseModel):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseError(OpenAIBaseModel):
    code: str
    message: str


class ResponsesResponse(OpenAIBaseModel):
    """The response object (also the `response` of the lifecycle events)."""

    id: str = Field(default_factory=lambda: f"resp_{random_uuid()}")
    created_at: int = Field(default_factory=lambda: int(time.time()))
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    metadata: dict[str, str] | None = None
    model: str
    object: Literal["response"] = "response"
    # Items in OpenAI's shapes: message, reasoning, function_call.
    output: list[dict[str, Any]] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    temperature: float | None = None
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_p: float | None = None
    background: bool = False
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    service_tier: str = "auto"
    status: ResponseStatus
    text: dict[str, Any] | None = None
    top_logprobs: int | None = None
    truncation: str | None = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None

    @classmethod
    def from_request(
        cls,
        request: ResponsesRequest,
        *,
        model_name: str,
        created_at: int,
        status: ResponseStatus,
        sampling_defaults: dict[str, Any],
        output: list[dict[str, Any]] | None = None,
        usage: ResponseUsage | None = None,
    ) -> ResponsesResponse:
        """The response to `request`, echoing its settings (the effective
        temperature and top_p: the request's, else the model's defaults)."""
        temperature = request.temperature
        if temperature is None:
            temperature = sampling_defaults.get("temperature", 1.0)
        top_p = request.top_p
        if top_p is None:
            top_p = sampling_defaults.get("top_p", 1.0)
        return cls(
            id=request.request_id,
            created_at=created_at,
            incomplete_details=(
                IncompleteDetails(reason="max_output_tokens") if status == "incomplete" else None
            ),
            instructions=request.instructions,
            metadata=request.metadata,
            model=model_name,
            output=output or [],
            parallel_tool_calls=bool(request.parallel_tool_calls),
            temperature=temperature,
            tool_choice=request.tool_choice,
            tools=request.tools,
            top_p=top_p,
            background=bool(request.background),
            max_output_tokens=request.max_output_tokens,
            max_tool_calls=request.max_tool_calls,
            previous_response_id=request.previous_response_id,
            reasoning=_dump(request.reasoning),
            service_tier=request.service_tier,
            status=status,
            text=_dump(request.text),
            top_logprobs=request.top_logprobs,
            truncation=request.truncation,
            usage=usage,
            user=request.user,
        )


def _dump(model: OpenAIBaseModel | None) -> dict[str, Any] | None:
    """A request setting as the client spelled it (`schema`, not `schema_`)."""
    return None if model is None else model.model_dump(by_alias=True, exclude_none=True)
