"""POST /sleep, POST /wake_up, GET /is_sleeping (upstream:
vllm/entrypoints/serve/dev/sleep/api_router.py). Needs --enable-sleep-mode.

    POST /sleep?level=1&mode=abort   level 0 pauses scheduling, 1 also frees
                                     the KV cache, 2 the weights too; mode
                                     "abort": the requests in flight end with
                                     "abort"; "wait": they finish first (the
                                     response comes once the engine is asleep);
                                     "keep": they resume after /wake_up
    POST /wake_up?tags=weights&tags=kv_cache   (no tags: everything)
    GET  /is_sleeping  -> {"is_sleeping": bool}

A request sent while the engine sleeps waits for /wake_up, as upstream.
Arguments the engine cannot honour are a 400 with the error envelope.
"""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from vllm.engine.protocol import EngineClient
from vllm.entrypoints.openai.openapi import DEV_ROUTE_RESPONSES
from vllm.entrypoints.serve.dev.errors import error_response
from vllm.logger import init_logger

logger = init_logger(__name__)

router = APIRouter()


class IsSleepingResponse(BaseModel):
    is_sleeping: bool


def engine_client(request: Request) -> EngineClient:
    return request.app.state.engine_client


@router.post("/sleep", response_class=Response, responses=DEV_ROUTE_RESPONSES)
async def sleep(
    raw_request: Request, level: int = Query(1), mode: str = Query("abort")
) -> Response:
    logger.info("Putting the engine to sleep (level %s, mode %s).", level, mode)
    try:
        await engine_client(raw_request).sleep(level, mode)
    except ValueError as e:
        return error_response(str(e))
    return Response(status_code=200)


@router.post("/wake_up", response_class=Response, responses=DEV_ROUTE_RESPONSES)
async def wake_up(raw_request: Request, tags: list[str] | None = Query(None)) -> Response:  # noqa: B008 (FastAPI idiom)
    # No tags (or an empty list) wakes everything up, as upstream.
    tags = tags or None
    logger.info("Waking up the engine (tags: %s).", tags)
    try:
        await engine_client(raw_request).wake_up(tags)
    except ValueError as e:
        return error_response(str(e), param="tags")
    return Response(status_code=200)


@router.get("/is_sleeping", response_model=IsSleepingResponse, responses=DEV_ROUTE_RESPONSES)
async def is_sleeping(raw_request: Request) -> JSONResponse:
    return JSONResponse({"is_sleeping": await engine_client(raw_request).is_sleeping()})
