"""POST /tokenize and /detokenize (upstream: vllm/entrypoints/serve/tokenize/api_router.py).

Both use the tokenizer of the served model only; no engine step runs.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import Response

from vllm.entrypoints.openai.openapi import TOKENIZE_RESPONSES
from vllm.entrypoints.openai.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from vllm.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from vllm.entrypoints.openai.utils import respond, validate_json_request
from vllm.entrypoints.utils import with_cancellation

router = APIRouter()


def tokenization(request: Request) -> OpenAIServingTokenization:
    return request.app.state.openai_serving_tokenization


@router.post(
    "/tokenize",
    dependencies=[Depends(validate_json_request)],
    response_model=TokenizeResponse,
    responses=TOKENIZE_RESPONSES,
)
@with_cancellation
async def tokenize(request: TokenizeRequest, raw_request: Request) -> Response:
    return respond(await tokenization(raw_request).create_tokenize(request))


@router.post(
    "/detokenize",
    dependencies=[Depends(validate_json_request)],
    response_model=DetokenizeResponse,
    responses=TOKENIZE_RESPONSES,
)
@with_cancellation
async def detokenize(request: DetokenizeRequest, raw_request: Request) -> Response:
    return respond(await tokenization(raw_request).create_detokenize(request))


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
