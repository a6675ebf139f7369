"""Request and response bodies of `/classify` (upstream:
vllm/entrypoints/pooling/classify/protocol.py). A body holds `input` (texts
or token ids, ClassificationCompletionRequest) or `messages` (one
conversation rendered with the chat template, ClassificationChatRequest).
One `ClassificationData` per input: the class probabilities (softmax /
sigmoid of the classifier's logits; the logits themselves with
`use_activation: false`), their count, and the label of the most probable
class from the model config's id2label.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, TypeAlias

from pydantic import Discriminator, Field, Tag

from vllm.entrypoints.openai.protocol_base import OpenAIBaseModel, UsageInfo
from vllm.entrypoints.pooling.base.protocol import (
    ChatRequestMixin,
    ClassifyRequestMixin,
    CompletionRequestMixin,
    PoolingBasicRequestMixin,
)
from vllm.pooling_params import PoolingParams
from vllm.utils import random_uuid


def chat_or_completion(data: Any) -> str:
    """Which body a request is: `messages` makes it a chat request."""
    return "chat" if isinstance(data, dict) and "messages" in data else "completion"


class _ClassifyParams(ClassifyRequestMixin):
    def to_pooling_params(self) -> PoolingParams:
        return PoolingParams(use_activation=self.use_activation)


class ClassificationCompletionRequest(
    PoolingBasicRequestMixin, CompletionRequestMixin, _ClassifyParams
):
    pass


class ClassificationChatRequest(PoolingBasicRequestMixin, ChatRequestMixin, _ClassifyParams):
    pass


ClassificationRequest: TypeAlias = Annotated[
    Annotated[ClassificationCompletionRequest, Tag("completion")]
    | Annotated[ClassificationChatRequest, Tag("chat")],
    Discriminator(chat_or_completion),
]
AnyClassificationRequest: TypeAlias = ClassificationCompletionRequest | ClassificationChatRequest


class ClassificationData(OpenAIBaseModel):
    index: int
    label: str | None
    probs: list[float]
    num_classes: int


class ClassificationResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"classify-{random_uuid()}")
    object: str = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[ClassificationData]
    usage: UsageInfo
