"""GET /health (upstream: vllm/entrypoints/serve/instrumentator/health.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from vllm.engine.protocol import EngineClient
from vllm.entrypoints.openai.openapi import HEALTH_RESPONSES
from vllm.v1.engine.exceptions import EngineDeadError

router = APIRouter()


def engine_client(request: Request) -> EngineClient:
    return request.app.state.engine_client


@router.get("/health", response_class=Response, responses=HEALTH_RESPONSES)
async def health(raw_request: Request) -> Response:
    """200 while the engine is alive, 503 once it is dead."""
    try:
        await engine_client(raw_request).check_health()
        return Response(status_code=200)
    except EngineDeadError:
        return Response(status_code=503)
