"""`/v1/embeddings` handler (upstream: vllm/entrypoints/pooling/embed/serving.py
ServingEmbedding): task "embed", one vector per input or conversation,
written as `encoding_format` says (PoolingServingBase.create_encoded)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from vllm.entrypoints.openai.protocol_base import ErrorResponse
from vllm.entrypoints.pooling.base.serving import PoolingServingBase
from vllm.entrypoints.pooling.embed.protocol import (
    AnyEmbeddingRequest,
    EmbeddingResponse,
    EmbeddingResponseData,
)
from vllm.entrypoints.pooling.utils import JsonEncodedPoolingOutput
from vllm.pooling_params import PoolingParams


class ServingEmbedding(PoolingServingBase):
    """Embeddings of texts, token ids or conversations (task "embed")."""

    async def create_embedding(
        self, request: AnyEmbeddingRequest, raw_request: Request | None = None
    ) -> EmbeddingResponse | Response | ErrorResponse:
        def make_params() -> PoolingParams:
            params = request.to_pooling_params()
            params.verify("embed", self.model_config)
            return params

        return await self.create_encoded(
            request, raw_request, "embd", make_params, _item, EmbeddingResponse
        )


def _item(index: int, embedding: JsonEncodedPoolingOutput) -> EmbeddingResponseData:
    return EmbeddingResponseData(index=index, embedding=embedding)  # type: ignore[arg-type]
