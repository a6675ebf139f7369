"""GET /health (upstream: vllm/entrypoints/serve/instrumentator/health.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from vllm.engine.protocol import EngineClient
from vllm.entrypoints.openai.openapi import HEALTH_RESPONSES
from vllm.v1.engine.exceptions import EngineDeadError

router = APIRouter()


def engine_client(request: Request) -> EngineClient:
    return request.app.state.engine_client


def engine_clients(state: Any) -> list[EngineClient]:
    """Every engine of the server: the main one, then the --embedding-model one."""
    second = getattr(state, "embedding_engine_client", None)
    return [state.engine_client] + ([second] if second is not None else [])


@router.get("/health", response_class=Response, responses=HEALTH_RESPONSES)
async def health(raw_request: Request) -> Response:
    """200 while every engine is alive, 503 once one of them is dead."""
    try:
        for engine in engine_clients(raw_request.app.state):
            await engine.check_health()
        return Response(status_code=200)
    except EngineDeadError:
        return Response(status_code=503)
