"""Request bodies of the OpenAI-compatible API, and (re-exported) every
other body (upstream: vllm/entrypoints/openai/protocol.py, one module there;
here the base and the generation responses live in protocol_base.py and
protocol_responses.py).

Requests validate what they know with pydantic, strictly typed (a string is
not a boolean); what pydantic rejects becomes a 400 with the error envelope,
never FastAPI's 422. Unknown fields are accepted and logged as ignored, as
upstream. Sizes are bounded here, before any tokenization: `n`, the number of
prompts, logprob counts.

`response_format` (json_object, json_schema{name, schema, strict}) and the
`structured_outputs` field both become `SamplingParams.structured_outputs`
(both at once is a 400). `use_beam_search` turns a request into beam search
params (`to_beam_search_params`), run by `OpenAIServing.beam_search`.
"""

from __future__ import annotations

import dataclasses
import time
import typing
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from vllm.entrypoints.openai.protocol_base import (  # noqa: F401 (re-exported)
    LOGPROB_FLOOR,
    MAX_N_SEQUENCES,
    MAX_PROMPTS_PER_REQUEST,
    ErrorInfo,
    ErrorResponse,
    Int64,
    OpenAIBaseModel,
    PromptTokenUsageInfo,
    StrictBool,
    StrictFloat,
    StrictInt,
    TokenId,
    UsageInfo,
    log_ignored_fields,
)
from vllm.entrypoints.openai.protocol_responses import (  # noqa: F401 (re-exported)
    ChatCompletionLogProb,
    ChatCompletionLogProbs,
    ChatCompletionLogProbsContent,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessage,
    CompletionLogProbs,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
    make_tool_call_id,
)
from vllm.sampling_params import BeamSearchParams, StructuredOutputsParams
from vllm.utils import random_uuid


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
    # Beyond upstream (an extra field, so OpenAI clients ignore it): the
    # model's tasks ("generate", or its pooler's: "embed", "classify", ...),
    # which tell a client of a two-model server which routes take the model.
    supported_tasks: list[str] | None = None


class ModelList(OpenAIBaseModel):
    object: str = "list"
    data: list[ModelCard] = Field(default_factory=list)


class StreamOptions(OpenAIBaseModel):
    include_usage: StrictBool | None = True
    continuous_usage_stats: StrictBool | None = False


class JsonSchemaResponseFormat(OpenAIBaseModel):
    """`response_format.json_schema` of OpenAI's structured outputs."""

    name: str
    description: str | None = None
    # OpenAI's key is "schema", which would shadow pydantic's BaseModel.schema:
    # the field is json_schema, read from "schema" (upstream does the same).
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(OpenAIBaseModel):
    """ "text" (no constraint), "json_object" (any JSON object) or "json_schema"."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaResponseFormat | None = None

    @model_validator(mode="after")
    def check_schema(self) -> ResponseFormat:
        if self.type == "json_schema" and (
            self.json_schema is None or self.json_schema.json_schema is None
        ):
            raise ValueError(
                "`response_format.json_schema` with its `schema` is required "
                'when `response_format.type` is "json_schema".'
            )
        return self

    def to_structured_outputs(self) -> StructuredOutputsParams | None:
        """The constraint this format asks for (None for "text")."""
        if self.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        if self.type == "json_schema":
            assert self.json_schema is not None  # check_schema
            return StructuredOutputsParams(json=self.json_schema.json_schema)
        return None


_STRUCTURED_OUTPUTS_FIELDS = frozenset(
    f.name for f in dataclasses.fields(StructuredOutputsParams) if not f.name.startswith("_")
)
_STRUCTURED_OUTPUTS_BOOLS = frozenset(
    name
    for name, hint in typing.get_type_hints(StructuredOutputsParams).items()
    if name in _STRUCTURED_OUTPUTS_FIELDS and (hint is bool or bool in typing.get_args(hint))
)


class SamplingRequestMixin(OpenAIBaseModel):
    """Fields shared by completion and chat requests (OpenAI's and vLLM's extras)."""

    model: str | None = None
    frequency_penalty: StrictFloat | None = 0.0
    # fail_fast on every list / dict field: one error, not one per item (a
    # list of 10**6 wrong items made 10**6 error records, about a GB).
    logit_bias: Annotated[dict[str, StrictFloat], Field(fail_fast=True)] | None = None
    n: StrictInt = Field(1, ge=1, le=MAX_N_SEQUENCES)
    presence_penalty: StrictFloat | None = 0.0
    response_format: ResponseFormat | None = None
    seed: Int64 | None = None
    stop: str | Annotated[list[str], Field(fail_fast=True)] | None = Field(default_factory=list)
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    user: str | None = None
    # --- vLLM's sampling extras ---
    top_k: StrictInt | None = None
    min_p: StrictFloat | None = None
    repetition_penalty: StrictFloat | None = None
    stop_token_ids: Annotated[list[TokenId], Field(fail_fast=True)] | None = Field(
        default_factory=list
    )
    include_stop_str_in_output: StrictBool = False
    ignore_eos: StrictBool = False
    min_tokens: StrictInt = Field(0, ge=0)
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    truncate_prompt_tokens: StrictInt | None = Field(None, ge=-1)
    allowed_token_ids: Annotated[list[TokenId], Field(fail_fast=True)] | None = None
    prompt_logprobs: StrictInt | None = Field(None, ge=-1)
    bad_words: Annotated[list[str], Field(fail_fast=True)] = Field(default_factory=list)
    priority: StrictInt = 0
    request_id: str = Field(
        default_factory=random_uuid, description="The request_id related to this request."
    )
    return_token_ids: StrictBool | None = None
    # Logprob entries named "token_id:<id>" rather than by their (maybe ambiguous) text.
    return_tokens_as_token_ids: StrictBool | None = None
    cache_salt: str | None = None
    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None
    structured_outputs: StructuredOutputsParams | None = Field(
        default=None,
        description="Constrain the output: exactly one of json (a JSON "
        "schema), regex, choice, grammar (EBNF), json_object or structural_tag.",
    )
    # Beam search (upstream's request fields): `n` is the beam width.
    use_beam_search: StrictBool = False
    length_penalty: StrictFloat = 1.0

    # What beam search honours (the rest, set to a non-default value, is a 400
    # rather than silently dropped): the prompt, its template and tokenization,
    # n, the length cap, temperature, EOS handling, streaming, the request's
    # identity and what the response carries.
    BEAM_SEARCH_FIELDS: ClassVar[frozenset[str]] = frozenset(
        {
            "model",
            "prompt",
            "messages",
            "n",
            "max_tokens",
            "max_completion_tokens",
            "temperature",
            "ignore_eos",
            "length_penalty",
            "include_stop_str_in_output",
            "use_beam_search",
            "stream",
            "stream_options",
            "user",
            "request_id",
            "priority",
            "add_special_tokens",
            "truncate_prompt_tokens",
            "add_generation_prompt",
            "continue_final_message",
            "chat_template",
            "chat_template_kwargs",
            "return_token_ids",
        }
    )

    @field_validator("structured_outputs", mode="before")
    @classmethod
    def check_structured_outputs_keys(cls, value: Any) -> Any:
        """StructuredOutputsParams is a dataclass (pydantic would drop unknown
        keys silently, take "yes" for true, and let a client set the fields
        the server fills in): log the unknown, refuse the rest."""
        if not isinstance(value, dict):
            return value
        for key, item in value.items():
            if isinstance(key, str) and key.startswith("_"):
                raise ValueError(
                    f"`structured_outputs.{key}` is set by the server, not by a request."
                )
            if key in _STRUCTURED_OUTPUTS_BOOLS and not isinstance(item, bool | None):
                raise ValueError(f"`structured_outputs.{key}` must be a boolean.")
        log_ignored_fields([k for k in value if k not in _STRUCTURED_OUTPUTS_FIELDS])
        return value

    @model_validator(mode="after")
    def check_stream_options(self) -> SamplingRequestMixin:
        if self.stream_options is not None and not self.stream:
            raise ValueError("Stream options can only be defined when `stream=True`.")
        if self.prompt_logprobs is not None and self.stream and self.prompt_logprobs != 0:
            raise ValueError("`prompt_logprobs` are not available when `stream=True`.")
        if self.cache_salt is not None and not self.cache_salt:
            raise ValueError("Parameter 'cache_salt' must be a non-empty string if provided.")
        if (
            self.structured_outputs is not None
            and self.response_format is not None
            and self.response_format.type != "text"
        ):
            raise ValueError(
                "`structured_outputs` and a non-text `response_format` both "
                "constrain the output: set only one of them."
            )
        return self

    @model_validator(mode="after")
    def check_beam_search(self) -> SamplingRequestMixin:
        if not self.use_beam_search:
            return self
        fields = type(self).model_fields
        # model_fields_set also holds the unknown (extra) keys: those are only
        # logged as ignored, never checked here.
        for name in sorted(self.model_fields_set & fields.keys() - self.BEAM_SEARCH_FIELDS):
            default = fields[name].get_default(call_default_factory=True)
            value = getattr(self, name)
            if value is not None and value != [] and value != default:
                raise ValueError(f"`{name}` is not supported with `use_beam_search`.")
        return self

    def to_beam_search_params(
        self, max_tokens: int, default_sampling_params: dict[str, Any]
    ) -> BeamSearchParams:
        """As upstream: beam width `n`; temperature from the request, else
        generation_config.json, else 1.0 (greedy beams need temperature 0)."""
        temperature = self.temperature
        if temperature is None:
            temperature = default_sampling_params.get("temperature", 1.0)
        return BeamSearchParams(
            beam_width=self.n,
            max_tokens=max_tokens,
            ignore_eos=self.ignore_eos,
            temperature=temperature,
            length_penalty=self.length_penalty,
            include_stop_str_in_output=self.include_stop_str_in_output,
        )


class CompletionRequest(SamplingRequestMixin):
    # https://platform.openai.com/docs/api-reference/completions/create
    prompt: (
        Annotated[list[TokenId], Field(max_length=MAX_N_SEQUENCES * 64, fail_fast=True)]
        | Annotated[
            list[Annotated[list[TokenId], Field(min_length=0, fail_fast=True)]],
            Field(max_length=MAX_PROMPTS_PER_REQUEST, fail_fast=True),
        ]
        | str
        | Annotated[list[str], Field(max_length=MAX_PROMPTS_PER_REQUEST, fail_fast=True)]
        | None
    ) = None
    echo: StrictBool | None = False
    logprobs: StrictInt | None = Field(None, ge=0)
    max_tokens: StrictInt | None = Field(16, ge=0)
    suffix: str | None = None
    add_special_tokens: StrictBool = True
    prompt_embeds: bytes | list[bytes] | None = None

    @model_validator(mode="after")
    def check_prompt(self) -> CompletionRequest:
        if self.prompt in (None, "", []) and not self.prompt_embeds:
            raise ValueError("Either prompt or prompt_embeds must be provided and non-empty.")
        if self.prompt_embeds is not None:
            raise ValueError(
                "`prompt_embeds` (prompt embeddings) are not supported by this server."
            )
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

    # Not ignored: every key of a message reaches the chat template.
    log_extra_fields: ClassVar[bool] = False

    role: str
    content: str | Annotated[list[dict[str, Any]], Field(fail_fast=True)] | None = None
    name: str | None = None
    # An assistant message's calls, as OpenAI returns them; a tool message
    # answers the call `tool_call_id`.
    tool_calls: Annotated[list[dict[str, Any]], Field(fail_fast=True)] | None = None
    tool_call_id: str | None = None
    # The reasoning of an earlier assistant turn (upstream accepts both names).
    reasoning: str | None = None
    reasoning_content: str | None = None

    @model_validator(mode="after")
    def check_tool_message(self) -> ChatMessageParam:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("A message with role 'tool' must have a `tool_call_id`.")
        return self


class ChatCompletionRequest(SamplingRequestMixin):
    # https://platform.openai.com/docs/api-reference/chat/create
    messages: Annotated[
        list[ChatMessageParam], Field(min_length=1, max_length=MAX_PROMPTS_PER_REQUEST)
    ]
    logprobs: StrictBool | None = False
    top_logprobs: StrictInt | None = Field(0, ge=0)
    max_tokens: StrictInt | None = Field(None, ge=0, deprecated=True)
    max_completion_tokens: StrictInt | None = Field(None, ge=0)
    tools: Annotated[list[ChatCompletionToolsParam], Field(fail_fast=True)] | None = None
    # None with tools means "auto" (OpenAI's default); see tool_choice.py.
    tool_choice: Literal["none", "auto", "required"] | ChatCompletionNamedToolChoiceParam | None = (
        None
    )
    parallel_tool_calls: StrictBool | None = True
    # --- vLLM's chat extras ---
    echo: StrictBool = False
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    add_special_tokens: StrictBool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # With --reasoning-parser: False leaves `reasoning` out of the response.
    include_reasoning: StrictBool = True

    @model_validator(mode="after")
    def check_chat_options(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("when using `top_logprobs`, `logprobs` must be set to true.")
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
            )
        return self


# ----------------------------------------------------------------------
# Tokenization
# ----------------------------------------------------------------------


class TokenizeCompletionRequest(OpenAIBaseModel):
    model: str | None = None
    prompt: str
    add_special_tokens: StrictBool = True
    return_token_strs: StrictBool | None = False


class TokenizeChatRequest(OpenAIBaseModel):
    model: str | None = None
    messages: Annotated[
        list[ChatMessageParam], Field(min_length=1, max_length=MAX_PROMPTS_PER_REQUEST)
    ]
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    add_special_tokens: StrictBool = False
    return_token_strs: StrictBool | None = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: Annotated[list[ChatCompletionToolsParam], Field(fail_fast=True)] | None = None

    @model_validator(mode="after")
    def check_generation_prompt(self) -> TokenizeChatRequest:
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
            )
        return self


TokenizeRequest = TokenizeCompletionRequest | TokenizeChatRequest


class TokenizeResponse(OpenAIBaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    tokens: Annotated[list[TokenId], Field(max_length=MAX_N_SEQUENCES * 64, fail_fast=True)]


class DetokenizeResponse(OpenAIBaseModel):
    prompt: str
