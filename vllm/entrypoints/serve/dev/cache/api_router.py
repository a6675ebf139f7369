"""POST /reset_prefix_cache (upstream: vllm/entrypoints/serve/dev/cache/api_router.py).

Drops every cached block that no running request holds. Upstream answers
200 whether or not the reset happened; here a reset refused because blocks
are in use is a 409 (`reset_running_requests=true` preempts the running
requests first, which then recompute). `reset_external` would reset a KV
connector's cache: no connector is built, so it is refused.
"""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from vllm.engine.protocol import EngineClient
from vllm.entrypoints.openai.openapi import DEV_ROUTE_RESPONSES
from vllm.entrypoints.serve.dev.errors import error_response
from vllm.logger import init_logger

logger = init_logger(__name__)

router = APIRouter()


def engine_client(request: Request) -> EngineClient:
    return request.app.state.engine_client


@router.post("/reset_prefix_cache", response_class=Response, responses=DEV_ROUTE_RESPONSES)
async def reset_prefix_cache(
    raw_request: Request,
    reset_running_requests: bool = Query(False),
    reset_external: bool = Query(False),
) -> Response:
    if reset_external:
        return error_response(
            "reset_external resets a KV connector's prefix cache; no KV connector is built.",
            param="reset_external",
        )
    logger.info("Resetting prefix cache...")
    if not await engine_client(raw_request).reset_prefix_cache(reset_running_requests):
        return error_response(
            "The prefix cache was not reset: running requests hold "
            "cached blocks (reset_running_requests=true preempts them).",
            status_code=409,
            err_type="ConflictError",
        )
    return Response(status_code=200)
