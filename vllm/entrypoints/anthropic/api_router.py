"""Routes of the Anthropic Messages API (upstream: vllm/entrypoints/anthropic/api_router.py).

    POST /v1/messages               a Message, or its SSE events with `stream: true`
    POST /v1/messages/count_tokens  {"input_tokens": N}

Every error of these routes uses Anthropic's envelope,
`{"type": "error", "error": {"type": "invalid_request_error", "message": ...}}`,
with the status the OpenAI routes would answer (400 bad input, 404 unknown
model, 500, 503 when the queue is full) and Anthropic's error type for it;
request-validation errors included (AnthropicRoute: upstream answers those
in the OpenAI shape, vllm#57997). The API-key check of the app (Bearer) and
its request-size limit apply as to every /v1 route.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine
from http import HTTPStatus
from typing import Any

import pydantic
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute

from vllm.entrypoints.anthropic.protocol import (
    AnthropicCountTokensRequest,
    AnthropicCountTokensResponse,
    AnthropicError,
    AnthropicErrorResponse,
    AnthropicMessagesRequest,
    AnthropicMessagesResponse,
    anthropic_error_type,
)
from vllm.entrypoints.anthropic.serving_messages import AnthropicServingMessages
from vllm.entrypoints.openai.protocol import ErrorResponse
from vllm.entrypoints.openai.utils import DisconnectAwareStreamingResponse, validate_json_request
from vllm.entrypoints.utils import Utf8JSONResponse as JSONResponse
from vllm.entrypoints.utils import with_cancellation
from vllm.logger import init_logger
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

logger = init_logger(__name__)

# A validation error message quotes at most this many errors, each cut to this length.
_MAX_ERRORS, _MAX_ERROR_CHARS = 10, 500


def anthropic_error(status: int, message: str) -> JSONResponse:
    """Anthropic's error envelope with `status` (a 503 asks to retry after 1 s)."""
    body = AnthropicErrorResponse(
        error=AnthropicError(type=anthropic_error_type(status), message=message)
    )
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse(content=body.model_dump(), status_code=status, headers=headers)


def translate_error_response(response: ErrorResponse) -> JSONResponse:
    """The OpenAI error body of the chat path, in Anthropic's envelope."""
    return anthropic_error(response.error.code, response.error.message)


# Components of a pydantic error location that name a union branch or a
# validator ("str", "list[...]", "function-after[...]"), not a field.
_BRANCH_TAG = re.compile(r"^(str|int|float|bool|none)$|[\[(]")


def _error_line(err: Any) -> tuple[str, bool]:
    """`loc: msg` of one error, and whether it is a union branch's type mismatch."""
    if not isinstance(err, dict):
        return str(err), False
    loc = [str(x) for x in err.get("loc", ()) if x != "body"]
    path = ".".join(x for x in loc if not _BRANCH_TAG.search(x))
    msg = str(err.get("msg", "")).removeprefix("Value error, ")
    branch = len(path.split(".")) < len(loc) and str(err.get("type", "")).endswith("_type")
    return (f"{path}: {msg}" if path else msg), branch


def validation_message(errors: list[Any]) -> str:
    """`loc: msg` per error (without the inputs: a body may be huge), bounded.

    Of a union (`content`: a string or blocks), the branches the value is not
    of are left out when another error says what is wrong."""
    lines = [_error_line(err) for err in errors]
    kept = [line for line, branch in lines if not branch] or [line for line, _ in lines]
    shown = [line[:_MAX_ERROR_CHARS] for line in kept[:_MAX_ERRORS]]
    if len(kept) > _MAX_ERRORS:
        shown.append(f"... and {len(kept) - _MAX_ERRORS} more")
    return "; ".join(shown)


class AnthropicRoute(APIRoute):
    """A route whose request-validation errors (bad JSON, wrong content type,
    fields pydantic refuses) answer in Anthropic's envelope, not the app's."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def anthropic_handler(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as e:
                return anthropic_error(400, validation_message(list(e.errors())))

        return anthropic_handler


router = APIRouter(route_class=AnthropicRoute)

_ERRORS: dict[int | str, dict[str, Any]] = {
    int(status): {"model": AnthropicErrorResponse, "description": status.phrase}
    for status in (
        HTTPStatus.BAD_REQUEST,
        HTTPStatus.NOT_FOUND,
        HTTPStatus.INTERNAL_SERVER_ERROR,
        HTTPStatus.SERVICE_UNAVAILABLE,
    )
}


def messages(request: Request) -> AnthropicServingMessages:
    return request.app.state.anthropic_serving_messages


def _internal_error(e: Exception) -> JSONResponse:
    if isinstance(e, (EngineDeadError, EngineGenerateError)):
        raise e  # the app's handler: 500, and shutdown when the engine is dead
    logger.exception("Error in an Anthropic Messages request", exc_info=e)
    return anthropic_error(500, "Internal server error")


@router.post(
    "/v1/messages",
    dependencies=[Depends(validate_json_request)],
    response_model=AnthropicMessagesResponse,
    responses={200: {"content": {"text/event-stream": {}}}, **_ERRORS},
)
@with_cancellation
async def create_messages(request: AnthropicMessagesRequest, raw_request: Request) -> Response:
    try:
        result = await messages(raw_request).create_messages(request, raw_request)
    except Exception as e:
        return _internal_error(e)
    if isinstance(result, ErrorResponse):
        return translate_error_response(result)
    if isinstance(result, pydantic.BaseModel):
        return JSONResponse(content=result.model_dump())
    return DisconnectAwareStreamingResponse(content=result, media_type="text/event-stream")


@router.post(
    "/v1/messages/count_tokens",
    dependencies=[Depends(validate_json_request)],
    response_model=AnthropicCountTokensResponse,
    responses=_ERRORS,
)
@with_cancellation
async def count_tokens(request: AnthropicCountTokensRequest, raw_request: Request) -> Response:
    try:
        result = await messages(raw_request).count_tokens(request, raw_request)
    except Exception as e:
        return _internal_error(e)
    if isinstance(result, ErrorResponse):
        return translate_error_response(result)
    return JSONResponse(content=result.model_dump())


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
