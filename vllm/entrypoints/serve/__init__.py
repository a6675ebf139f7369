"""Routes of `vllm serve` outside the OpenAI API proper (upstream:
vllm/entrypoints/serve/): liveness, version and metrics (`instrumentator/`),
tokenization (`tokenize/`), under VLLM_ALLOW_RUNTIME_LORA_UPDATING the LoRA
adapter routes (`lora/`), and under VLLM_SERVER_DEV_MODE=1 the operator
routes (`dev/`: sleep mode, prefix cache)."""

from __future__ import annotations

from fastapi import FastAPI


def register_vllm_serve_api_routers(app: FastAPI) -> None:
    from vllm.entrypoints.serve.dev import register_dev_api_routers
    from vllm.entrypoints.serve.instrumentator import register_instrumentator_api_routers
    from vllm.entrypoints.serve.lora.api_router import attach_router as attach_lora
    from vllm.entrypoints.serve.tokenize.api_router import attach_router as attach_tokenize

    register_instrumentator_api_routers(app)
    attach_lora(app)
    attach_tokenize(app)
    register_dev_api_routers(app)
