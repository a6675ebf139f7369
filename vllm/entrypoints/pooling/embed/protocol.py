"""Request and response bodies of `/v1/embeddings` (upstream:
vllm/entrypoints/pooling/embed/protocol.py).

`input` is a string, a list of strings, a list of token ids or a list of
token-id lists (OpenAI's four forms). `encoding_format` "float" returns each
vector as a JSON list; "base64" as the base64 text of its little-endian
float32 bytes (4 bytes a value, in order), what the `openai` client decodes
with `np.frombuffer(base64.b64decode(s), dtype="float32")`. Any other format
is a 400 (pydantic's error, as the server's envelope).
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

from pydantic import Field

from vllm.entrypoints.openai.protocol_base import (
    MAX_N_SEQUENCES,
    MAX_PROMPTS_PER_REQUEST,
    OpenAIBaseModel,
    StrictBool,
    StrictInt,
    TokenId,
    UsageInfo,
)
from vllm.utils import random_uuid

EncodingFormat = Literal["float", "base64"]

EmbeddingInput = (
    Annotated[list[TokenId], Field(max_length=MAX_N_SEQUENCES * 64, fail_fast=True)]
    | Annotated[
        list[Annotated[list[TokenId], Field(fail_fast=True)]],
        Field(max_length=MAX_PROMPTS_PER_REQUEST, fail_fast=True),
    ]
    | str
    | Annotated[list[str], Field(max_length=MAX_PROMPTS_PER_REQUEST, fail_fast=True)]
)


class EmbeddingCompletionRequest(OpenAIBaseModel):
    # https://platform.openai.com/docs/api-reference/embeddings/create
    model: str | None = None
    input: EmbeddingInput
    encoding_format: EncodingFormat = "float"
    # Matryoshka models only (PoolingParams.verify refuses it otherwise).
    dimensions: StrictInt | None = None
    user: str | None = None
    # -1: keep the last max_model_len tokens; k: keep k tokens.
    truncate_prompt_tokens: StrictInt | None = Field(None, ge=-1)

    # --- vLLM's extras ---
    add_special_tokens: StrictBool = True
    priority: StrictInt = 0
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
