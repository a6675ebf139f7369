"""GET /metrics: the process's Prometheus registry in the text exposition
format (upstream: vllm/entrypoints/serve/instrumentator/metrics.py)."""

from __future__ import annotations

import prometheus_client
from fastapi import APIRouter, FastAPI
from fastapi.responses import Response

router = APIRouter()


@router.get("/metrics", response_class=Response)
async def metrics() -> Response:
    return Response(
        prometheus_client.generate_latest(prometheus_client.REGISTRY),
        media_type=prometheus_client.CONTENT_TYPE_LATEST,
    )


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
