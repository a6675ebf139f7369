"""Routes of the Responses API (upstream: vllm/entrypoints/openai/responses/api_router.py):

    POST /v1/responses                    create (JSON, or SSE with `stream`)
    GET  /v1/responses/{response_id}      a stored response
    POST /v1/responses/{response_id}/cancel   cancel a background response

The API key (--api-key) guards them as every other /v1 route
(api_server.AuthenticationMiddleware covers all paths but a few probes).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import Response

from vllm.entrypoints.openai.openapi import GENERATE_RESPONSES, TOKENIZE_RESPONSES
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest, ResponsesResponse
from vllm.entrypoints.openai.responses.serving import OpenAIServingResponses
from vllm.entrypoints.openai.utils import respond, validate_json_request
from vllm.entrypoints.utils import with_cancellation

router = APIRouter()


def responses(raw_request: Request) -> OpenAIServingResponses:
    return raw_request.app.state.openai_serving_responses


@router.post(
    "/v1/responses",
    dependencies=[Depends(validate_json_request)],
    response_model=ResponsesResponse,
    responses=GENERATE_RESPONSES,
)
@with_cancellation
async def create_responses(request: ResponsesRequest, raw_request: Request) -> Response:
    return respond(await responses(raw_request).create_responses(request, raw_request))


@router.get(
    "/v1/responses/{response_id}",
    response_model=ResponsesResponse,
    responses=TOKENIZE_RESPONSES,
)
async def retrieve_responses(
    response_id: str,
    raw_request: Request,
    starting_after: int | None = None,
    stream: bool | None = False,
) -> Response:
    handler = responses(raw_request)
    return respond(await handler.retrieve_responses(response_id, starting_after, stream))


@router.post(
    "/v1/responses/{response_id}/cancel",
    response_model=ResponsesResponse,
    responses=TOKENIZE_RESPONSES,
)
async def cancel_responses(response_id: str, raw_request: Request) -> Response:
    return respond(await responses(raw_request).cancel_responses(response_id))


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
