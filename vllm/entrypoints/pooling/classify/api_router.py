"""POST /classify (upstream: vllm/entrypoints/pooling/classify/api_router.py).
Registered only for a model whose pooler supports task "classify"."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from vllm.entrypoints.openai.utils import respond, validate_json_request
from vllm.entrypoints.pooling.classify.protocol import (
    ClassificationRequest,
    ClassificationResponse,
)
from vllm.entrypoints.pooling.classify.serving import ServingClassification
from vllm.entrypoints.utils import with_cancellation

router = APIRouter()


def classify(request: Request) -> ServingClassification:
    return request.app.state.openai_serving_classification


@router.post(
    "/classify",
    dependencies=[Depends(validate_json_request)],
    response_model=ClassificationResponse,
)
@with_cancellation
async def create_classify(request: ClassificationRequest, raw_request: Request) -> Response:
    return respond(await classify(raw_request).create_classify(request, raw_request))
