"""GET /metrics: the Prometheus registry in the text exposition format
(upstream: vllm/entrypoints/serve/instrumentator/metrics.py): this process's,
or with several API servers (`--api-server-count`) all of theirs, read from
the multiprocess directory (vllm/v1/metrics/prometheus.py)."""

from __future__ import annotations

import prometheus_client
from fastapi import APIRouter, FastAPI
from fastapi.responses import Response

from vllm.v1.metrics.prometheus import get_prometheus_registry

router = APIRouter()


@router.get("/metrics", response_class=Response)
async def metrics() -> Response:
    return Response(
        prometheus_client.generate_latest(get_prometheus_registry()),
        media_type=prometheus_client.CONTENT_TYPE_LATEST,
    )


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
