"""POST /pooling (upstream: vllm/entrypoints/pooling/pooling/api_router.py).
Registered for any model with a pooling task."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from vllm.entrypoints.openai.utils import respond, validate_json_request
from vllm.entrypoints.pooling.pooling.protocol import PoolingRequest, PoolingResponse
from vllm.entrypoints.pooling.pooling.serving import ServingPooling
from vllm.entrypoints.utils import with_cancellation

router = APIRouter()


def pooling(request: Request) -> ServingPooling:
    return request.app.state.openai_serving_pooling


@router.post(
    "/pooling",
    dependencies=[Depends(validate_json_request)],
    response_model=PoolingResponse,
)
@with_cancellation
async def create_pooling(request: PoolingRequest, raw_request: Request) -> Response:
    result = await pooling(raw_request).create_pooling(request, raw_request)
    # encoding_format "bytes" / "bytes_only": the body is the raw bytes.
    return result if isinstance(result, Response) else respond(result)
