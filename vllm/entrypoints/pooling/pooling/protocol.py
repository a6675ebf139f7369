"""Request and response bodies of `/pooling` (upstream:
vllm/entrypoints/pooling/pooling/protocol.py): the pooler's raw output per
input or conversation (a vector, or one row per token for the token_*
tasks), written as `encoding_format` says (../utils.py). IOProcessor plugin
requests (task "plugin") are not built.
"""

from __future__ import annotations

import time
from typing import Annotated, TypeAlias

from pydantic import Discriminator, Field, Tag

from vllm.entrypoints.openai.protocol_base import OpenAIBaseModel, UsageInfo
from vllm.entrypoints.pooling.base.protocol import (
    ChatRequestMixin,
    CompletionRequestMixin,
    EmbedRequestMixin,
    PoolingBasicRequestMixin,
)
from vllm.entrypoints.pooling.classify.protocol import chat_or_completion
from vllm.pooling_params import PoolingParams
from vllm.tasks import PoolingTask
from vllm.utils import random_uuid


class _PoolingOptions(EmbedRequestMixin):
    # None: the model's pooling task (see ServingPooling).
    task: PoolingTask | None = None

    def to_pooling_params(self) -> PoolingParams:
        # use_activation: the embedding tasks' normalization, the
        # classification tasks' softmax / sigmoid (PoolingParams' one field).
        return PoolingParams(use_activation=self.use_activation)


class PoolingCompletionRequest(PoolingBasicRequestMixin, CompletionRequestMixin, _PoolingOptions):
    pass


class PoolingChatRequest(PoolingBasicRequestMixin, ChatRequestMixin, _PoolingOptions):
    pass


PoolingRequest: TypeAlias = Annotated[
    Annotated[PoolingCompletionRequest, Tag("completion")]
    | Annotated[PoolingChatRequest, Tag("chat")],
    Discriminator(chat_or_completion),
]
AnyPoolingRequest: TypeAlias = PoolingCompletionRequest | PoolingChatRequest


class PoolingResponseData(OpenAIBaseModel):
    index: int
    object: str = "pooling"
    data: list[list[float]] | list[float] | str


class PoolingResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"pool-{random_uuid()}")
    object: str = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[PoolingResponseData]
    usage: UsageInfo
