"""Request checks and responses shared by the OpenAI-style routes
(upstream: vllm/entrypoints/openai/utils.py holds `validate_json_request`).

A serving handler returns a pydantic response, an `ErrorResponse` or an async
iterator of SSE lines; `respond` turns any of them into the HTTP response:
JSON, the error envelope with its status, or a stream that stops as soon as
the client goes away.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pydantic
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from vllm.entrypoints.openai.protocol import ErrorResponse

# Starlette's, except that it never fails on a lone surrogate (see there).
from vllm.entrypoints.utils import Utf8JSONResponse as JSONResponse


async def validate_json_request(raw_request: Request) -> None:
    """Route dependency: a body that is not `application/json` is a 400."""
    media_type = raw_request.headers.get("content-type", "").lower().split(";", 1)[0].strip()
    if media_type != "application/json":
        raise RequestValidationError(
            errors=["Unsupported Media Type: Only 'application/json' is allowed"]
        )


def respond(result: Any) -> Response:
    """The HTTP response for what a serving handler returned."""
    if isinstance(result, ErrorResponse):
        return error_json(result)
    if isinstance(result, pydantic.BaseModel):
        return JSONResponse(content=result.model_dump())
    return DisconnectAwareStreamingResponse(content=result, media_type="text/event-stream")


def error_json(error: ErrorResponse) -> JSONResponse:
    """The error envelope with its HTTP status (`code`); a 503 asks the
    client to retry after a second."""
    headers = {"Retry-After": "1"} if error.error.code == 503 else None
    return JSONResponse(content=error.model_dump(), status_code=error.error.code, headers=headers)


class DisconnectAwareStreamingResponse(StreamingResponse):
    """A stream that stops (and aborts its request) as soon as the client
    disconnects, even while no token is being sent, and always closes its
    generator."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        stream = asyncio.create_task(self.stream_response(send))
        disconnect = asyncio.create_task(_wait_disconnect(receive))
        try:
            await asyncio.wait([stream, disconnect], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (stream, disconnect):
                task.cancel()
            await asyncio.gather(stream, disconnect, return_exceptions=True)
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
