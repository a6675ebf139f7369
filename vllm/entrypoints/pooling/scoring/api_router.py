"""POST /score, /v1/score, /rerank, /v1/rerank and /v2/rerank (upstream:
vllm/entrypoints/pooling/scoring/api_router.py). Registered when the model
supports task "classify" (a cross-encoder) or "embed" (cosine of embeddings);
a classifier with more than one label has no handler: 501, as upstream's
routes answer without one.
/v1/score and /v1/rerank are upstream's older paths (a warning once asks the
client to move); /v2/rerank (Cohere's v2 path) is the same handler."""

from __future__ import annotations

from http import HTTPStatus

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from vllm.entrypoints.openai.serving_engine import OpenAIServing
from vllm.entrypoints.openai.utils import respond, validate_json_request
from vllm.entrypoints.pooling.scoring.protocol import (
    RerankRequest,
    RerankResponse,
    ScoreRequest,
    ScoreResponse,
)
from vllm.entrypoints.pooling.scoring.serving import ServingScores
from vllm.entrypoints.utils import with_cancellation
from vllm.logger import init_logger

logger = init_logger(__name__)

router = APIRouter()


def scores(request: Request) -> ServingScores | None:
    return getattr(request.app.state, "serving_scores", None)


def _unsupported(api: str) -> Response:
    """Upstream's answer when the model has no scoring handler (a
    classifier with more than one label)."""
    return respond(
        OpenAIServing.create_error_response(
            f"The model does not support {api}",
            "NotImplementedError",
            HTTPStatus.NOT_IMPLEMENTED,
        )
    )


@router.post("/score", dependencies=[Depends(validate_json_request)], response_model=ScoreResponse)
@with_cancellation
async def create_score(request: ScoreRequest, raw_request: Request) -> Response:
    handler = scores(raw_request)
    if handler is None:
        return _unsupported("Score API")
    return respond(await handler.create_score(request, raw_request))


@router.post(
    "/v1/score", dependencies=[Depends(validate_json_request)], response_model=ScoreResponse
)
@with_cancellation
async def create_score_v1(request: ScoreRequest, raw_request: Request) -> Response:
    logger.warning_once(
        "To indicate that Score API is not part of standard OpenAI API, we have moved it "
        "to `/score`. Please update your client accordingly."
    )
    handler = scores(raw_request)
    if handler is None:
        return _unsupported("Score API")
    return respond(await handler.create_score(request, raw_request))


@router.post(
    "/rerank", dependencies=[Depends(validate_json_request)], response_model=RerankResponse
)
@with_cancellation
async def do_rerank(request: RerankRequest, raw_request: Request) -> Response:
    handler = scores(raw_request)
    if handler is None:
        return _unsupported("Rerank (Score) API")
    return respond(await handler.do_rerank(request, raw_request))


@router.post(
    "/v1/rerank", dependencies=[Depends(validate_json_request)], response_model=RerankResponse
)
@with_cancellation
async def do_rerank_v1(request: RerankRequest, raw_request: Request) -> Response:
    logger.warning_once(
        "To indicate that the rerank API is not part of the standard OpenAI API, we have "
        "located it at `/rerank`. Please update your client accordingly. (Note: Conforms "
        "to JinaAI rerank API)"
    )
    handler = scores(raw_request)
    if handler is None:
        return _unsupported("Rerank (Score) API")
    return respond(await handler.do_rerank(request, raw_request))


@router.post(
    "/v2/rerank", dependencies=[Depends(validate_json_request)], response_model=RerankResponse
)
@with_cancellation
async def do_rerank_v2(request: RerankRequest, raw_request: Request) -> Response:
    handler = scores(raw_request)
    if handler is None:
        return _unsupported("Rerank (Score) API")
    return respond(await handler.do_rerank(request, raw_request))
