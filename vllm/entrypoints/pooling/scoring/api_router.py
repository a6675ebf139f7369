"""POST /score, /v1/score, /rerank, /v1/rerank and /v2/rerank (upstream:
vllm/entrypoints/pooling/scoring/api_router.py). Registered when the model
supports task "classify" (a cross-encoder) or "embed" (cosine of embeddings);
a classifier with more than one label has no handler: 501, as upstream's
routes answer without one.
One handler serves each API on all its paths: /v1/score and /v1/rerank are
upstream's older paths (a warning asks the client to move: on every
/v1/score call, once for /v1/rerank, as upstream); /v2/rerank is Cohere's v2
path."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

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


_SCORE_MOVED = (
    "To indicate that Score API is not part of standard OpenAI API, we have moved it "
    "to `/score`. Please update your client accordingly."
)
_RERANK_MOVED = (
    "To indicate that the rerank API is not part of the standard OpenAI API, we have "
    "located it at `/rerank`. Please update your client accordingly. (Note: Conforms "
    "to JinaAI rerank API)"
)
# Older path -> (the warning that asks the client to move, only once?).
_OLD_PATHS = {"/v1/score": (_SCORE_MOVED, False), "/v1/rerank": (_RERANK_MOVED, True)}


async def _serve(
    raw_request: Request, api: str, call: Callable[[ServingScores], Awaitable[Any]]
) -> Response:
    """Warn on an older path, answer 501 without a handler, else respond
    with what `call(handler)` returns."""
    route = raw_request.scope.get("route")
    old = _OLD_PATHS.get(getattr(route, "path", ""))
    if old is not None:
        (logger.warning_once if old[1] else logger.warning)(old[0])
    handler = scores(raw_request)
    if handler is None:
        return _unsupported(api)
    return respond(await call(handler))


_JSON = [Depends(validate_json_request)]


@router.post("/score", dependencies=_JSON, response_model=ScoreResponse)
@router.post("/v1/score", dependencies=_JSON, response_model=ScoreResponse)
@with_cancellation
async def create_score(request: ScoreRequest, raw_request: Request) -> Response:
    return await _serve(raw_request, "Score API", lambda h: h.create_score(request, raw_request))


@router.post("/rerank", dependencies=_JSON, response_model=RerankResponse)
@router.post("/v1/rerank", dependencies=_JSON, response_model=RerankResponse)
@router.post("/v2/rerank", dependencies=_JSON, response_model=RerankResponse)
@with_cancellation
async def do_rerank(request: RerankRequest, raw_request: Request) -> Response:
    return await _serve(
        raw_request, "Rerank (Score) API", lambda h: h.do_rerank(request, raw_request)
    )
