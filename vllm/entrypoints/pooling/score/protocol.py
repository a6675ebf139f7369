"""Request and response bodies of `/score` and `/rerank` (upstream:
vllm/entrypoints/pooling/score/protocol.py).

`/score` pairs its two sides 1:1, 1:N or N:N; upstream accepts four spellings
of them, tried in this order: `queries` + `documents`, `queries` + `items`,
`data_1` + `data_2`, `text_1` + `text_2`. `/rerank` (Jina / Cohere shape)
scores one `query` against `documents` and returns them by relevance, the
best `top_n` (0 or less: all). Texts only: multimodal score inputs are not
built (a content-part dict is refused by validation).
"""

from __future__ import annotations

import time
from typing import Annotated, TypeAlias

from pydantic import BaseModel, Field

from vllm.entrypoints.openai.protocol_base import (
    MAX_PROMPTS_PER_REQUEST,
    OpenAIBaseModel,
    StrictBool,
    StrictInt,
    UsageInfo,
)
from vllm.pooling_params import PoolingParams
from vllm.utils import random_uuid

ScoreInput: TypeAlias = str
ScoreInputs: TypeAlias = (
    str | Annotated[list[str], Field(max_length=MAX_PROMPTS_PER_REQUEST, fail_fast=True)]
)


class ScoringRequestMixin(OpenAIBaseModel):
    model: str | None = None
    user: str | None = None
    # -1: truncate to max_model_len; k: the tokenizer truncates each pair
    # (cross-encoder) or each text (embedding model) to k tokens.
    truncate_prompt_tokens: StrictInt | None = Field(None, ge=-1)
    priority: StrictInt = 0
    # None: the pooler config's default (a cross-encoder's sigmoid).
    use_activation: StrictBool | None = None

    def to_pooling_params(self) -> PoolingParams:
        return PoolingParams(use_activation=self.use_activation)


class ScoreQueriesDocumentsRequest(ScoringRequestMixin):
    queries: ScoreInputs
    documents: ScoreInputs

    @property
    def data_1(self) -> ScoreInputs:
        return self.queries

    @property
    def data_2(self) -> ScoreInputs:
        return self.documents


class ScoreQueriesItemsRequest(ScoringRequestMixin):
    queries: ScoreInputs
    items: ScoreInputs

    @property
    def data_1(self) -> ScoreInputs:
        return self.queries

    @property
    def data_2(self) -> ScoreInputs:
        return self.items


class ScoreDataRequest(ScoringRequestMixin):
    data_1: ScoreInputs
    data_2: ScoreInputs


class ScoreTextRequest(ScoringRequestMixin):
    text_1: ScoreInputs
    text_2: ScoreInputs

    @property
    def data_1(self) -> ScoreInputs:
        return self.text_1

    @property
    def data_2(self) -> ScoreInputs:
        return self.text_2


ScoreRequest: TypeAlias = (
    ScoreQueriesDocumentsRequest | ScoreQueriesItemsRequest | ScoreDataRequest | ScoreTextRequest
)


class RerankRequest(ScoringRequestMixin):
    query: ScoreInput
    documents: ScoreInputs
    # 0 (or less): every document.
    top_n: StrictInt = 0


class RerankDocument(BaseModel):
    text: str | None = None


class RerankResult(BaseModel):
    index: int
    document: RerankDocument
    relevance_score: float


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(OpenAIBaseModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class ScoreResponseData(OpenAIBaseModel):
    index: int
    object: str = "score"
    score: float


class ScoreResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"score-{random_uuid()}")
    object: str = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[ScoreResponseData]
    usage: UsageInfo
