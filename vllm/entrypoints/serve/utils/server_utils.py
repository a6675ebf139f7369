"""The server's API-key check and its error handlers (upstream:
vllm/entrypoints/serve/utils/server_utils.py for AuthenticationMiddleware,
vllm/entrypoints/serve/exception_handling/ for the handlers; one module here).

Errors use the envelope {"error": {"message", "type", "param", "code"}} with
the HTTP status equal to `code`; request validation errors are 400 (never
422). An engine error stops the server once the engine is dead
(`terminate_if_errored`), unless VLLM_KEEP_ALIVE_ON_ENGINE_DEATH is set.
"""

from __future__ import annotations

import hashlib
import secrets
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from vllm.entrypoints.launcher import terminate_if_errored
from vllm.entrypoints.openai.protocol import ErrorInfo, ErrorResponse
from vllm.entrypoints.serve.instrumentator.health import engine_clients
from vllm.entrypoints.serve.playground.api_router import PLAYGROUND_PATHS

# Starlette's, except that it never fails on a lone surrogate (see there).
from vllm.entrypoints.utils import Utf8JSONResponse as JSONResponse
from vllm.logger import init_logger
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError, QueueOverflowError

logger = init_logger("vllm.entrypoints.openai.api_server")

# Paths that answer without an API key: liveness, version, API docs and the
# playground's static files (a browser cannot send the key when it loads a
# page; everything the page does needs it). Every other path (inference,
# tokenization, metrics, unknown ones) needs the key.
UNGUARDED_PATHS = frozenset(
    {"/health", "/ping", "/version", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
    | PLAYGROUND_PATHS
)


def _validation_message(errors: list[Any]) -> tuple[str, str | None]:
    """Bounded message: at most 10 errors of 1000 chars, inputs cut at 200."""
    n = len(errors)
    lines, param = [], None
    for err in errors[:10]:
        if not isinstance(err, dict):
            lines.append(str(err)[:1000])
            continue
        loc = ".".join(str(x) for x in err.get("loc", ()))
        param = param or loc or None
        line = f"{loc}: {err.get('msg', '')}"
        if "input" in err and err.get("type") != "missing":
            line += f" (input: {repr(err['input'])[:200]})"
        lines.append(line[:1000])
    if n == 1 and not isinstance(errors[0], dict):
        return lines[0], None
    more = f"\n  ... and {n - 10} more" if n > 10 else ""
    message = f"{n} validation error{'s' if n != 1 else ''}:\n  " + "\n  ".join(lines) + more
    return message, param


def _error_body(message: str, err_type: str, code: int, param: str | None = None) -> dict[str, Any]:
    return ErrorResponse(
        error=ErrorInfo(message=message, type=err_type, param=param, code=code)
    ).model_dump()


def init_exception_handler(app: FastAPI) -> None:
    """The error envelope for validation, HTTP, overload (503 + Retry-After),
    engine (500; stops the server once the engine is dead) and other errors."""

    @app.exception_handler(RequestValidationError)
    async def validation_exception_handler(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(list(exc.errors()))
        return JSONResponse(
            _error_body(message, HTTPStatus.BAD_REQUEST.phrase, 400, param), status_code=400
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_exception_handler(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            _error_body(str(exc.detail), HTTPStatus(exc.status_code).phrase, exc.status_code),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(QueueOverflowError)
    async def overflow_handler(_: Request, exc: QueueOverflowError) -> JSONResponse:
        return JSONResponse(
            _error_body(str(exc), "ServiceUnavailableError", 503),
            status_code=503,
            headers={"Retry-After": str(exc.retry_after)},
        )

    async def engine_error_handler(req: Request, exc: Exception) -> JSONResponse:
        server = getattr(req.app.state, "server", None)
        if server is not None:
            for engine in engine_clients(req.app.state):
                terminate_if_errored(server, engine)
        return JSONResponse(_error_body(str(exc), "InternalServerError", 500), status_code=500)

    app.add_exception_handler(EngineDeadError, engine_error_handler)
    app.add_exception_handler(EngineGenerateError, engine_error_handler)

    @app.exception_handler(Exception)
    async def internal_error_handler(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("Unhandled error", exc_info=exc)
        return JSONResponse(
            _error_body("Internal server error", "InternalServerError", 500), status_code=500
        )


class AuthenticationMiddleware:
    """API-key check on every path but UNGUARDED_PATHS (pure ASGI).

    The key comes from `Authorization: Bearer <key>` (OpenAI clients) or, when
    that header is absent, from `x-api-key: <key>` (Anthropic clients and
    proxies such as LiteLLM send it there; upstream accepts only Bearer, its
    issue #51572). Keys are compared as SHA-256 digests with `secrets.compare_digest`, against
    every key, so the time taken does not depend on where a guess differs.
    """

    def __init__(self, app: ASGIApp, tokens: list[str]) -> None:
        self.app = app
        self.api_tokens = [hashlib.sha256(t.encode("utf-8")).digest() for t in tokens]

    def verify_token(self, headers: Headers) -> bool:
        authorization = headers.get("Authorization")
        if authorization is None and "x-api-key" in headers:
            param = headers["x-api-key"]
        else:
            scheme, _, param = (authorization or "").partition(" ")
            if scheme.lower() != "bearer":
                return False
        param_hash = hashlib.sha256(param.encode("utf-8")).digest()
        match = False
        for token_hash in self.api_tokens:
            match |= secrets.compare_digest(param_hash, token_hash)
        return match

    @staticmethod
    def is_unguarded(scope: Scope) -> bool:
        """Only an exact, un-encoded spelling of an allow-listed path passes."""
        path = scope.get("path", "")
        raw = scope.get("raw_path")
        if raw is not None:
            raw_path = raw.decode("latin-1").split("?", 1)[0]
            if raw_path != path:
                return False  # percent-encoding, or a path the server rewrote
        root_path = scope.get("root_path") or ""
        if root_path and path.startswith(root_path):
            path = path[len(root_path) :]
        return path in UNGUARDED_PATHS

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS":
            # CORS preflights carry no credentials by design.
            return await self.app(scope, receive, send)
        if self.is_unguarded(scope) or self.verify_token(Headers(scope=scope)):
            return await self.app(scope, receive, send)
        response = JSONResponse(content={"error": "Unauthorized"}, status_code=401)
        return await response(scope, receive, send)
