"""The pooling routes of a server whose model has no pooling task (no
upstream counterpart: upstream registers none of them, so a generative model
answers FastAPI's bare 404 "Not Found").

Here the status stays 404 (the route is not served) but the error envelope
names the model, its tasks and the API asked for, so a client pointed at the
wrong server learns why. The routes stay out of the OpenAPI schema, as they
serve nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from http import HTTPStatus

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from vllm.entrypoints.openai.protocol_base import ErrorInfo, ErrorResponse

# Each pooling route and the API it belongs to (as upstream names them).
POOLING_ROUTES: dict[str, str] = {
    "/v1/embeddings": "Embeddings",
    "/pooling": "Pooling",
    "/classify": "Classification",
    "/score": "Score",
    "/v1/score": "Score",
    "/rerank": "Rerank",
    "/v1/rerank": "Rerank",
    "/v2/rerank": "Rerank",
}


def _model_name(request: Request) -> str:
    models = getattr(request.app.state, "openai_serving_models", None)
    paths = getattr(models, "base_model_paths", None)
    return paths[0].name if paths else "(unknown)"


def _refusal(api: str, tasks: str) -> Callable[[Request], Awaitable[JSONResponse]]:
    async def refuse(raw_request: Request) -> JSONResponse:
        message = (
            f"The model `{_model_name(raw_request)}` does not support the {api} API "
            f"(its tasks: {tasks}); serve a pooling model (`--runner pooling`) for it."
        )
        body = ErrorResponse(
            error=ErrorInfo(message=message, type="NotFoundError", param="model", code=404)
        )
        return JSONResponse(body.model_dump(), status_code=HTTPStatus.NOT_FOUND)

    return refuse


def unsupported_pooling_router(supported_tasks: tuple[str, ...]) -> APIRouter:
    """404s naming the model for every pooling route (a model without a
    pooling task)."""
    router = APIRouter(include_in_schema=False)
    tasks = ", ".join(supported_tasks) or "none"
    for path, api in POOLING_ROUTES.items():
        router.add_api_route(path, _refusal(api, tasks), methods=["POST"])
    return router
