"""What /openapi.json declares for the API server's routes.

Every status a route can answer is declared with its body, so that clients
and schema-driven fuzzers (tests/entrypoints/openai/test_openai_schema.py)
can rely on the schema: errors use the ErrorResponse envelope; validation
errors are 400 (the server never answers FastAPI's 422); 503 is the queue
limit (--max-num-queued-reqs); 500 an engine failure; 401 the API-key check.
"""

from __future__ import annotations

from collections.abc import Iterable
from http import HTTPStatus
from typing import Any

import pydantic
from fastapi import FastAPI

from vllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    UnauthorizedResponse,
)

Responses = dict[int | str, dict[str, Any]]


def _errors(*statuses: HTTPStatus) -> Responses:
    return {int(s): {"model": ErrorResponse, "description": s.phrase} for s in statuses}


def _ref(model: type[pydantic.BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


TOKENIZE_RESPONSES = _errors(
    HTTPStatus.BAD_REQUEST, HTTPStatus.NOT_FOUND, HTTPStatus.INTERNAL_SERVER_ERROR
)
GENERATE_RESPONSES: Responses = {
    # Besides the JSON body of the route's response_model: the SSE stream
    # that `stream: true` returns.
    200: {"content": {"text/event-stream": {}}},
    **_errors(
        HTTPStatus.BAD_REQUEST,
        HTTPStatus.NOT_FOUND,
        HTTPStatus.INTERNAL_SERVER_ERROR,
        HTTPStatus.SERVICE_UNAVAILABLE,
    ),
}
# The operator routes (VLLM_SERVER_DEV_MODE=1, vllm/entrypoints/serve/dev/).
DEV_ROUTE_RESPONSES = _errors(
    HTTPStatus.BAD_REQUEST, HTTPStatus.CONFLICT, HTTPStatus.INTERNAL_SERVER_ERROR
)
HEALTH_RESPONSES: Responses = {
    200: {"description": "The engine is alive."},
    503: {"description": "The engine is dead."},
}
# /invocations reads its body by hand (a chat or a completion body): declare both.
INVOCATIONS_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {"anyOf": [_ref(ChatCompletionRequest), _ref(CompletionRequest)]}
            }
        },
    }
}
INVOCATIONS_RESPONSES: Responses = {
    **GENERATE_RESPONSES,
    200: {
        "description": "A chat or completion response, or its SSE stream.",
        "content": {
            "application/json": {
                "schema": {"anyOf": [_ref(ChatCompletionResponse), _ref(CompletionResponse)]}
            },
            "text/event-stream": {},
        },
    },
}


def install_openapi(app: FastAPI, guarded: bool, unguarded_paths: Iterable[str]) -> None:
    """Finish the generated schema: drop the 422 FastAPI adds to every route
    with a body (this server answers 400, declared per route); with an API key
    (`guarded`), declare the 401 of every path but `unguarded_paths`."""
    generate = app.openapi
    unguarded = frozenset(unguarded_paths)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        spec = generate()  # also cached in app.openapi_schema: edited in place
        schemas = spec.setdefault("components", {}).setdefault("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        unauthorized = {
            "description": "Missing or wrong API key (Authorization: Bearer).",
            "content": {"application/json": {"schema": _ref(UnauthorizedResponse)}},
        }
        if guarded:
            schemas[UnauthorizedResponse.__name__] = UnauthorizedResponse.model_json_schema()
        for path, operations in spec.get("paths", {}).items():
            for operation in operations.values():
                operation["responses"].pop("422", None)
                if guarded and path not in unguarded:
                    operation["responses"]["401"] = unauthorized
        return spec

    app.openapi = openapi  # type: ignore[method-assign]
