"""Request and response bodies of `/classify` (upstream:
vllm/entrypoints/pooling/classify/protocol.py). One `ClassificationData` per
input: the class probabilities (softmax / sigmoid of the classifier's
logits; the logits themselves with `use_activation: false`), their count,
and the label of the most probable class from the model config's id2label.
"""

from __future__ import annotations

import time

from pydantic import Field

from vllm.entrypoints.openai.protocol_base import OpenAIBaseModel, StrictBool, UsageInfo
from vllm.entrypoints.pooling.base.protocol import PoolingBasicRequestMixin
from vllm.utils import random_uuid


class ClassificationCompletionRequest(PoolingBasicRequestMixin):
    # None: the pooler config's default (apply the activation).
    use_activation: StrictBool | None = None


ClassificationRequest = ClassificationCompletionRequest


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
