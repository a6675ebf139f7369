"""Request and response bodies of `/v1/embeddings` (upstream:
vllm/entrypoints/pooling/embed/protocol.py).

`input` and the other shared fields: base/protocol.py. `encoding_format` "float" returns each
vector as a JSON list; "base64" as the base64 text of its little-endian
float32 bytes (4 bytes a value, in order), what the `openai` client decodes
with `np.frombuffer(base64.b64decode(s), dtype="float32")`. Any other format
is a 400 (pydantic's error, as the server's envelope).
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import Field

from vllm.entrypoints.openai.protocol_base import OpenAIBaseModel, StrictBool, StrictInt, UsageInfo
from vllm.entrypoints.pooling.base.protocol import PoolingBasicRequestMixin
from vllm.utils import random_uuid

EncodingFormat = Literal["float", "base64"]


class EmbeddingCompletionRequest(PoolingBasicRequestMixin):
    # https://platform.openai.com/docs/api-reference/embeddings/create
    encoding_format: EncodingFormat = "float"
    # Matryoshka models only (PoolingParams.verify refuses it otherwise).
    dimensions: StrictInt | None = None
    # --- vLLM's extras ---
    # None: the pooler config's default (normalized for embedding models).
    normalize: StrictBool | None = None


EmbeddingRequest = EmbeddingCompletionRequest


class EmbeddingResponseData(OpenAIBaseModel):
    index: int
    object: str = "embedding"
    embedding: list[float] | str


class EmbeddingResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"embd-{random_uuid()}")
    object: str = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[EmbeddingResponseData]
    usage: UsageInfo
