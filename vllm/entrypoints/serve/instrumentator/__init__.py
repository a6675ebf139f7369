"""Liveness, version and Prometheus metrics routes
(upstream: vllm/entrypoints/serve/instrumentator/)."""

from __future__ import annotations

from fastapi import FastAPI


def register_instrumentator_api_routers(app: FastAPI) -> None:
    from vllm.entrypoints.serve.instrumentator.basic import router as basic_router
    from vllm.entrypoints.serve.instrumentator.health import router as health_router
    from vllm.entrypoints.serve.instrumentator.metrics import attach_router as attach_metrics

    app.include_router(health_router)
    app.include_router(basic_router)
    attach_metrics(app)
