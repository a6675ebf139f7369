"""POST /v1/embeddings (upstream: vllm/entrypoints/pooling/embed/api_router.py).
Registered only for a model whose pooler supports task "embed"."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from vllm.entrypoints.openai.utils import respond, validate_json_request
from vllm.entrypoints.pooling.embed.protocol import EmbeddingRequest, EmbeddingResponse
from vllm.entrypoints.pooling.embed.serving import ServingEmbedding
from vllm.entrypoints.utils import with_cancellation

router = APIRouter()


def embedding(request: Request) -> ServingEmbedding:
    return request.app.state.openai_serving_embedding


@router.post(
    "/v1/embeddings",
    dependencies=[Depends(validate_json_request)],
    response_model=EmbeddingResponse,
)
@with_cancellation
async def create_embedding(request: EmbeddingRequest, raw_request: Request) -> Response:
    result = await embedding(raw_request).create_embedding(request, raw_request)
    # encoding_format "bytes" / "bytes_only": the body is the raw bytes.
    return result if isinstance(result, Response) else respond(result)
