"""Request and response bodies of `/score` and `/rerank` (upstream:
vllm/entrypoints/pooling/scoring/protocol.py).

`/score` pairs its two sides 1:1, 1:N or N:N; upstream accepts four spellings
of them, tried in this order: `queries` + `documents`, `queries` + `items`,
`data_1` + `data_2`, `text_1` + `text_2`. `/rerank` (Jina / Cohere shape)
scores one `query` against `documents` and returns them by relevance, the
best `top_n` (0: all). `max_tokens_per_query` / `max_tokens_per_doc` cut each
query / document to that many content tokens (0: off) before pairing.

Not built, refused when given: multimodal score inputs (a content-part dict
fails validation) and score templates (`instruction`,
`chat_template_kwargs`: upstream applies them only through a chat template
for scoring, which this server has none of).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, TypeAlias

from pydantic import BaseModel, Field, model_validator

from vllm.entrypoints.openai.protocol_base import (
    MAX_PROMPTS_PER_REQUEST,
    OpenAIBaseModel,
    StrictInt,
    UsageInfo,
)
from vllm.entrypoints.pooling.base.protocol import (
    ClassifyRequestMixin,
    PoolingBasicRequestMixin,
)
from vllm.pooling_params import PoolingParams
from vllm.utils import random_uuid

ScoreInput: TypeAlias = str
ScoreInputs: TypeAlias = (
    str | Annotated[list[str], Field(max_length=MAX_PROMPTS_PER_REQUEST, fail_fast=True)]
)


class ScoringRequestMixin(PoolingBasicRequestMixin, ClassifyRequestMixin):
    """model, user, truncate_prompt_tokens (-1: max_model_len; k: the
    tokenizer truncates each pair of a cross-encoder, each text of an
    embedding model, to k tokens), truncation_side, priority (the base
    mixin's) and use_activation (None: the pooler config's default, a
    cross-encoder's sigmoid)."""

    # 0: no per-text cut; else below max_model_len (checked by the handler).
    max_tokens_per_query: StrictInt = 0
    max_tokens_per_doc: StrictInt = 0
    instruction: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _refuse_score_templates(self) -> ScoringRequestMixin:
        for name in ("instruction", "chat_template_kwargs"):
            if getattr(self, name) is not None:
                raise ValueError(
                    f"`{name}` is not supported: score templates (chat templates for "
                    "scoring) are not built."
                )
        return self

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
    # 0: every document.
    top_n: StrictInt = Field(0, ge=0)


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
