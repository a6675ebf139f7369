"""Routes of `vllm serve` outside the OpenAI API proper (upstream:
vllm/entrypoints/serve/): liveness, version and metrics (`instrumentator/`),
tokenization (`tokenize/`)."""
from __future__ import annotations

from fastapi import FastAPI


def register_vllm_serve_api_routers(app: FastAPI) -> None:
    from vllm.entrypoints.serve.instrumentator import register_instrumentator_api_routers
    from vllm.entrypoints.serve.tokenize.api_router import attach_router as attach_tokenize

    register_instrumentator_api_routers(app)
    attach_tokenize(app)
