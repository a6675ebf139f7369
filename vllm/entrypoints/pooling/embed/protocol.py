"""Request and response bodies of `/v1/embeddings` (upstream:
vllm/entrypoints/pooling/embed/protocol.py; the Cohere `/v2/embed` bodies
are not built).

A body is one of (told apart by `_request_kind`):
- EmbeddingCompletionRequest: `input` texts or token ids;
- EmbeddingChatRequest: `messages`, one conversation (or `input` holding one
  conversation, upstream's EmbeddingChatInputRequest);
- EmbeddingBatchChatRequest: `messages`, a list of conversations (or `input`
  holding them, upstream's EmbeddingBatchChatInputRequest), one vector each.
The encodings of the vectors: ../utils.py.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, TypeAlias

from pydantic import Discriminator, Field, Tag, model_validator

from vllm.entrypoints.openai.protocol import ChatMessageParam
from vllm.entrypoints.openai.protocol_base import (
    MAX_PROMPTS_PER_REQUEST,
    OpenAIBaseModel,
    UsageInfo,
)
from vllm.entrypoints.pooling.base.protocol import (
    ChatRequestMixin,
    ChatRequestOptionsMixin,
    CompletionRequestMixin,
    EmbedRequestMixin,
    PoolingBasicRequestMixin,
)
from vllm.pooling_params import PoolingParams
from vllm.utils import random_uuid


def _is_chat_messages(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in value)
    )


def _is_batched_chat_messages(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(_is_chat_messages(c) for c in value)


def _request_kind(data: Any) -> str:
    if not isinstance(data, dict):
        return "completion"
    messages = data["messages"] if "messages" in data else data.get("input")
    if _is_batched_chat_messages(messages):
        return "batch_chat"
    if "messages" in data or _is_chat_messages(messages):
        return "chat"
    return "completion"


def _messages_from_input(data: Any) -> Any:
    """Upstream's *ChatInputRequest: the conversation(s) sent as `input`."""
    if isinstance(data, dict) and "messages" not in data and "input" in data:
        data = {k: v for k, v in data.items() if k != "input"} | {"messages": data["input"]}
    return data


class _EmbedParams(EmbedRequestMixin):
    def to_pooling_params(self) -> PoolingParams:
        # An embedding's activation is its L2 normalization.
        return PoolingParams(dimensions=self.dimensions, use_activation=self.use_activation)


class EmbeddingCompletionRequest(PoolingBasicRequestMixin, CompletionRequestMixin, _EmbedParams):
    # https://platform.openai.com/docs/api-reference/embeddings/create
    pass


class EmbeddingChatRequest(PoolingBasicRequestMixin, ChatRequestMixin, _EmbedParams):
    @model_validator(mode="before")
    @classmethod
    def _input_as_messages(cls, data: Any) -> Any:
        return _messages_from_input(data)


class EmbeddingBatchChatRequest(PoolingBasicRequestMixin, ChatRequestOptionsMixin, _EmbedParams):
    messages: Annotated[
        list[Annotated[list[ChatMessageParam], Field(min_length=1)]],
        Field(min_length=1, max_length=MAX_PROMPTS_PER_REQUEST),
    ]

    @model_validator(mode="before")
    @classmethod
    def _input_as_messages(cls, data: Any) -> Any:
        return _messages_from_input(data)


EmbeddingRequest: TypeAlias = Annotated[
    Annotated[EmbeddingCompletionRequest, Tag("completion")]
    | Annotated[EmbeddingChatRequest, Tag("chat")]
    | Annotated[EmbeddingBatchChatRequest, Tag("batch_chat")],
    Discriminator(_request_kind),
]
AnyEmbeddingRequest: TypeAlias = (
    EmbeddingCompletionRequest | EmbeddingChatRequest | EmbeddingBatchChatRequest
)


class EmbeddingResponseData(OpenAIBaseModel):
    index: int
    object: str = "embedding"
    embedding: list[float] | str


class EmbeddingResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"embd-{random_uuid()}")
    object: str = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str | None = None
    data: list[EmbeddingResponseData]
    usage: UsageInfo
