"""Helpers of the HTTP entry points (upstream: vllm/entrypoints/utils.py)."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Coroutine
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

# nginx's "client closed request": the answer to a request nobody waits for.
HTTP_CLIENT_CLOSED_REQUEST = 499


async def listen_for_disconnect(request: Request) -> None:
    """Return once the client has disconnected."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            break


def with_cancellation(handler_func: Callable[..., Coroutine[Any, Any, Any]]) -> Callable[..., Any]:
    """Run a route handler until it finishes or its client disconnects.

    The handler runs as a task next to one that waits for `http.disconnect`;
    whichever ends first cancels the other. Cancelling the handler cancels the
    engine request it is awaiting, which aborts it and frees its KV blocks.

    Only for handlers whose body FastAPI has already read into a model: the
    listener consumes every later message of the request. A StreamingResponse
    returned by the handler watches for disconnects itself from then on.
    """

    # wraps keeps the signature FastAPI reads to inject the parameters.
    @functools.wraps(handler_func)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        request = args[1] if len(args) > 1 else kwargs["raw_request"]
        handler_task = asyncio.create_task(handler_func(*args, **kwargs))
        cancellation_task = asyncio.create_task(listen_for_disconnect(request))
        done, pending = await asyncio.wait(
            [handler_task, cancellation_task], return_when=asyncio.FIRST_COMPLETED
        )
        for task in pending:
            task.cancel()
        if handler_task in done:
            return handler_task.result()
        return Response(status_code=HTTP_CLIENT_CLOSED_REQUEST)

    return wrapper


class Utf8JSONResponse(JSONResponse):
    """Starlette's JSONResponse, except that a lone surrogate (JSON may carry
    "\\ud800", which Python decodes into a str UTF-8 cannot encode) is written
    back as its JSON escape instead of failing the response with a 500: error
    messages quote what the client sent (an unknown model name, a bad key)."""

    def render(self, content: Any) -> bytes:
        # Outside strings json.dumps writes ASCII only, so every character that
        # UTF-8 rejects sits inside a string, where "\\uXXXX" is its JSON escape.
        return json.dumps(
            content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
        ).encode("utf-8", errors="backslashreplace")
