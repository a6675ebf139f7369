"""Request and response bodies of `/pooling` (upstream:
vllm/entrypoints/pooling/pooling/protocol.py): the pooler's raw output per
input (a vector, or one row per token for the token_* tasks), as JSON
floats or base64 (little-endian float32 bytes, rows one after another).
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import Field

from vllm.entrypoints.openai.protocol_base import OpenAIBaseModel, StrictBool, StrictInt, UsageInfo
from vllm.entrypoints.pooling.base.protocol import PoolingBasicRequestMixin
from vllm.tasks import PoolingTask
from vllm.utils import random_uuid


class PoolingCompletionRequest(PoolingBasicRequestMixin):
    # None: the model's default pooling task (see ServingPooling).
    task: PoolingTask | None = None
    encoding_format: Literal["float", "base64"] = "float"
    # Refused (400) as upstream: "dimensions is currently not supported".
    dimensions: StrictInt | None = None
    # embed / token_embed only; classify / token_classify only (PoolingParams.verify).
    normalize: StrictBool | None = None
    use_activation: StrictBool | None = None


PoolingRequest = PoolingCompletionRequest


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
