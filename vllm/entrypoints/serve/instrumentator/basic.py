"""GET /version (upstream: vllm/entrypoints/serve/instrumentator/basic.py)."""

from __future__ import annotations

from fastapi import APIRouter

from vllm.entrypoints.utils import Utf8JSONResponse as JSONResponse
from vllm.version import __version__ as VLLM_VERSION

router = APIRouter()


@router.get("/version")
async def show_version() -> JSONResponse:
    return JSONResponse(content={"version": VLLM_VERSION})
