"""Request and response bodies of the OpenAI-compatible API (upstream:
vllm/entrypoints/openai/protocol.py).

Requests accept unknown fields (OpenAI clients send new ones all the time)
and validate what they know with pydantic; what pydantic rejects becomes a
400 with the error envelope, never FastAPI's 422. Sizes are bounded here,
before any tokenization: `n`, the number of prompts, logprob counts.
"""
from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from vllm.sampling_params import StructuredOutputsParams
from vllm.utils import random_uuid

# Upstream's VLLM_MAX_N_SEQUENCES: the largest `n` a request may ask for.
MAX_N_SEQUENCES = 16384
# Most prompts one completion request may batch.
MAX_PROMPTS_PER_REQUEST = 1024
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# Logprobs of -inf do not survive JSON: report this floor instead.
LOGPROB_FLOOR = -9999.0


class OpenAIBaseModel(BaseModel):
    # Clients send fields this server does not know: accept them.
    model_config = ConfigDict(extra="allow")


class ErrorInfo(OpenAIBaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(OpenAIBaseModel):
    error: ErrorInfo


class UnauthorizedResponse(OpenAIBaseModel):
    """The body of a 401 (upstream's, not OpenAI's envelope)."""
    error: Literal["Unauthorized"] = "Unauthorized"


class ModelPermission(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"modelperm-{random_uuid()}")
    object: str = "model_permission"
    created: int = Field(default_factory=lambda: int(time.time()))
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(OpenAIBaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "vllm"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[ModelPermission] = Field(default_factory=list)


class ModelList(OpenAIBaseModel):
    object: str = "list"
    data: list[ModelCard] = Field(default_factory=list)


class PromptTokenUsageInfo(OpenAIBaseModel):
    cached_tokens: int | None = None


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: PromptTokenUsageInfo | None = None


class StreamOptions(OpenAIBaseModel):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class JsonSchemaResponseFormat(OpenAIBaseModel):
    """`response_format.json_schema` of OpenAI's structured outputs."""

    name: str
    description: str | None = None
    # OpenAI's key is "schema", which would shadow pydantic's BaseModel.schema:
    # the field is json_schema, read from "schema" (upstream does the same).
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(OpenAIBaseModel):
    """"text" (no constraint), "json_object" (any JSON object) or "json_schema"."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaResponseFormat | None = None

    @model_validator(mode="after")
    def check_schema(self) -> "ResponseFormat":
        if self.type == "json_schema" and (self.json_schema is None
                                           or self.json_schema.json_schema is None):
            raise ValueError("`response_format.json_schema` with its `schema` is required "
                             "when `response_format.type` is \"json_schema\".")
        return self

    def to_structured_outputs(self) -> StructuredOutputsParams | None:
        """The constraint this format asks for (None for "text")."""
        if self.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        if self.type == "json_schema":
            assert self.json_schema is not None  # check_schema
            return StructuredOutputsParams(json=self.json_schema.json_schema)
        return None


Int64 = Annotated[int, Field(ge=_INT64_MIN, le=_INT64_MAX)]
TokenId = Annotated[int, Field(ge=0)]


class SamplingRequestMixin(OpenAIBaseModel):
    """Fields shared by completion and chat requests (OpenAI's and vLLM's extras)."""

    model: str | None = None
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    n: int = Field(1, ge=1, le=MAX_N_SEQUENCES)
    presence_penalty: float | None = 0.0
    response_format: ResponseFormat | None = None
    seed: Int64 | None = None
    stop: str | list[str] | None = Field(default_factory=list)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    # --- vLLM's sampling extras ---
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[TokenId] | None = Field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    allowed_token_ids: list[TokenId] | None = None
    prompt_logprobs: int | None = Field(None, ge=-1)
    bad_words: list[str] = Field(default_factory=list)
    priority: int = 0
    request_id: str = Field(default_factory=random_uuid,
                            description="The request_id related to this request.")
    return_token_ids: bool | None = None
    # Logprob entries named "token_id:<id>" rather than by their (maybe ambiguous) text.
    return_tokens_as_token_ids: bool | None = None
    cache_salt: str | None = None
    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None
    structured_outputs: StructuredOutputsParams | None = Field(
        default=None, description="Constrain the output: exactly one of json (a JSON "
        "schema), regex, choice, grammar (EBNF), json_object or structural_tag.")

    @model_validator(mode="after")
    def check_stream_options(self) -> "SamplingRequestMixin":
        if self.stream_options is not None and not self.stream:
            raise ValueError("Stream options can only be defined when `stream=True`.")
        if self.prompt_logprobs is not None and self.stream and self.prompt_logprobs != 0:
            raise ValueError("`prompt_logprobs` are not available when `stream=True`.")
        if self.cache_salt is not None and not self.cache_salt:
            raise ValueError("Parameter 'cache_salt' must be a non-empty string if provided.")
        if self.structured_outputs is not None and self.response_format is not None \
                and self.response_format.type != "text":
            raise ValueError("`structured_outputs` and a non-text `response_format` both "
                             "constrain the output: set only one of them.")
        return self


class CompletionRequest(SamplingRequestMixin):
    # https://platform.openai.com/docs/api-reference/completions/create
    prompt: (Annotated[list[TokenId], Field(max_length=MAX_N_SEQUENCES * 64)]
             | Annotated[list[Annotated[list[TokenId], Field(min_length=0)]],
                         Field(max_length=MAX_PROMPTS_PER_REQUEST)]
             | str
             | Annotated[list[str], Field(max_length=MAX_PROMPTS_PER_REQUEST)]
             | None) = None
    echo: bool | None = False
    logprobs: int | None = Field(None, ge=0)
    max_tokens: int | None = Field(16, ge=0)
    suffix: str | None = None
    add_special_tokens: bool = True
    prompt_embeds: bytes | list[bytes] | None = None

    @model_validator(mode="after")
    def check_prompt(self) -> "CompletionRequest":
        if self.prompt in (None, "", []) and not self.prompt_embeds:
            raise ValueError("Either prompt or prompt_embeds must be provided and non-empty.")
        if self.prompt_embeds is not None:
            raise ValueError("Prompt embeddings are not supported by this server.")
        if self.suffix is not None:
            raise ValueError("suffix is not currently supported")
        return self


class FunctionDefinition(OpenAIBaseModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ChatCompletionToolsParam(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class ChatCompletionNamedFunction(OpenAIBaseModel):
    name: str


class ChatCompletionNamedToolChoiceParam(OpenAIBaseModel):
    """`tool_choice: {"type": "function", "function": {"name": ...}}`: call that tool."""
    function: ChatCompletionNamedFunction
    type: Literal["function"] = "function"


class ChatMessageParam(OpenAIBaseModel):
    """One message of a conversation; unknown keys are kept (and reach the template)."""

    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class ChatCompletionRequest(SamplingRequestMixin):
    # https://platform.openai.com/docs/api-reference/chat/create
    messages: Annotated[list[ChatMessageParam], Field(min_length=1,
                                                      max_length=MAX_PROMPTS_PER_REQUEST)]
    logprobs: bool | None = False
    top_logprobs: int | None = Field(0, ge=0)
    max_tokens: int | None = Field(None, ge=0, deprecated=True)
    max_completion_tokens: int | None = Field(None, ge=0)
    tools: list[ChatCompletionToolsParam] | None = None
    # None with tools means "auto" (OpenAI's default); see tool_choice.py.
    tool_choice: (Literal["none", "auto", "required"] | ChatCompletionNamedToolChoiceParam
                  | None) = None
    parallel_tool_calls: bool | None = True
    # --- vLLM's chat extras ---
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def check_chat_options(self) -> "ChatCompletionRequest":
        if self.top_logprobs and not self.logprobs:
            raise ValueError("when using `top_logprobs`, `logprobs` must be set to true.")
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("Cannot set both `continue_final_message` and "
                             "`add_generation_prompt` to True.")
        return self


# ----------------------------------------------------------------------
# Completion responses
# ----------------------------------------------------------------------

class CompletionLogProbs(OpenAIBaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionResponseChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: list[dict[int, dict[str, Any]] | None] | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None


class CompletionResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"cmpl-{random_uuid()}")
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    system_fingerprint: str | None = None
    usage: UsageInfo


class CompletionResponseStreamChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None


class CompletionStreamResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"cmpl-{random_uuid()}")
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseStreamChoice]
    usage: UsageInfo | None = Field(default=None)


# ----------------------------------------------------------------------
# Chat responses
# ----------------------------------------------------------------------

class ChatCompletionLogProb(OpenAIBaseModel):
    token: str
    logprob: float = LOGPROB_FLOOR
    bytes: list[int] | None = None


class ChatCompletionLogProbsContent(ChatCompletionLogProb):
    top_logprobs: list[ChatCompletionLogProb] = Field(default_factory=list)


class ChatCompletionLogProbs(OpenAIBaseModel):
    content: list[ChatCompletionLogProbsContent] | None = None


def make_tool_call_id() -> str:
    return f"chatcmpl-tool-{random_uuid()}"


class FunctionCall(OpenAIBaseModel):
    name: str
    arguments: str  # the arguments as JSON text


class ToolCall(OpenAIBaseModel):
    id: str = Field(default_factory=make_tool_call_id)
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaFunctionCall(OpenAIBaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(OpenAIBaseModel):
    """A streamed piece of a tool call: the first carries id, type and name."""
    id: str | None = None
    type: Literal["function"] | None = None
    index: int  # the call's position in the message's tool_calls
    function: DeltaFunctionCall | None = None


class ChatMessage(OpenAIBaseModel):
    role: str
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatCompletionResponseChoice(OpenAIBaseModel):
    index: int
    message: ChatMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"chatcmpl-{random_uuid()}")
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None
    prompt_logprobs: list[dict[int, dict[str, Any]] | None] | None = None
    prompt_token_ids: list[int] | None = None


class DeltaMessage(OpenAIBaseModel):
    role: str | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] = Field(default_factory=list)

    @model_serializer(mode="wrap")
    def _drop_absent(self, handler: Any) -> dict[str, Any]:
        # As upstream's exclude_unset chunks and OpenAI's: a delta carries
        # `role` only in its first chunk and `tool_calls` only when there are
        # some (an empty list is truthy in JS: `if (delta.tool_calls)`).
        data = handler(self)
        if not data.get("tool_calls"):
            data.pop("tool_calls", None)
        if data.get("role") is None:
            data.pop("role", None)
        return data


class ChatCompletionResponseStreamChoice(OpenAIBaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionStreamResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"chatcmpl-{random_uuid()}")
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | None = Field(default=None)
    prompt_token_ids: list[int] | None = None


# ----------------------------------------------------------------------
# Tokenization
# ----------------------------------------------------------------------

class TokenizeCompletionRequest(OpenAIBaseModel):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(OpenAIBaseModel):
    model: str | None = None
    messages: Annotated[list[ChatMessageParam], Field(min_length=1,
                                                      max_length=MAX_PROMPTS_PER_REQUEST)]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_token_strs: bool | None = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatCompletionToolsParam] | None = None

    @model_validator(mode="after")
    def check_generation_prompt(self) -> "TokenizeChatRequest":
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("Cannot set both `continue_final_message` and "
                             "`add_generation_prompt` to True.")
        return self


TokenizeRequest = TokenizeCompletionRequest | TokenizeChatRequest


class TokenizeResponse(OpenAIBaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    tokens: Annotated[list[TokenId], Field(max_length=MAX_N_SEQUENCES * 64)]


class DetokenizeResponse(OpenAIBaseModel):
    prompt: str
