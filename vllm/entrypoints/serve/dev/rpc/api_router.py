"""POST /collective_rpc (upstream: vllm/entrypoints/serve/dev/rpc/api_router.py).

Upstream calls any worker method named in the request body, with the
arguments it gives: a remote-code-execution surface even in dev mode. It is
not built here; the route exists so that a client learns that, with the error
envelope, instead of a bare 404.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from vllm.entrypoints.openai.openapi import DEV_ROUTE_RESPONSES
from vllm.entrypoints.serve.dev.errors import error_response

router = APIRouter()


@router.post("/collective_rpc", response_class=JSONResponse, responses=DEV_ROUTE_RESPONSES)
async def collective_rpc() -> JSONResponse:
    return error_response(
        "/collective_rpc (calling worker methods by name over HTTP) is not built; the "
        "sleep mode, prefix-cache and engine routes are.",
        param="method",
    )
