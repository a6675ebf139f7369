"""The OpenAI-compatible API server (upstream: vllm/entrypoints/openai/api_server.py).

    run_server(args): bind the socket -> AsyncLLM (engine core in a child
    process) -> build_app(args) -> init_app_state(...) -> uvicorn.

With --embedding-model a second AsyncLLM serves the pooling routes
(embedding_model.py): `build_embedding_engine_client`, the pooling serving
objects built on it in `init_app_state`, /health and the watchdog over both.

Routes here: /v1/completions, /v1/chat/completions, /v1/models, /invocations,
/ping; from vllm/entrypoints/serve/: /health, /version, /metrics, /tokenize,
/detokenize, and with VLLM_ALLOW_RUNTIME_LORA_UPDATING /v1/load_lora_adapter
and /v1/unload_lora_adapter (response helpers in openai/utils.py). The
--lora-modules adapters are loaded before the server answers; a request's
`model` selects one by name (serving_models.py). Errors use the
envelope {"error": {"message", "type", "param", "code"}} with the HTTP status
equal to `code`; request validation errors are 400 (never 422).

With --api-key (or VLLM_API_KEY), every route is guarded except the paths in
UNGUARDED_PATHS: the check is on the exact raw path, so `//v1`, `%2Fv1` or
`/v1/../v1` spellings cannot slip past it.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import signal
import socket
from argparse import Namespace
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Any

import pydantic
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

import vllm.envs as envs
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.engine.protocol import EngineClient
from vllm.entrypoints.anthropic.api_router import attach_router as attach_anthropic_router
from vllm.entrypoints.anthropic.serving_messages import AnthropicServingMessages
from vllm.entrypoints.chat_utils import load_chat_template
from vllm.entrypoints.launcher import serve_http, terminate_if_errored
from vllm.entrypoints.openai.embedding_model import (
    build_embedding_engine_client,
    check_main_model,
    embedding_served_names,
    embedding_watchdog,
    start_async_llm,
)
from vllm.entrypoints.openai.openapi import (
    GENERATE_RESPONSES,
    HEALTH_RESPONSES,
    INVOCATIONS_OPENAPI,
    INVOCATIONS_RESPONSES,
    install_openapi,
)
from vllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorInfo,
    ErrorResponse,
    ModelList,
)
from vllm.entrypoints.openai.request_limits import (
    RequestBodyLimitMiddleware,
    default_max_request_body_bytes,
    prompt_length_bound,
)
from vllm.entrypoints.openai.responses.api_router import attach_router as attach_responses
from vllm.entrypoints.openai.responses.serving import OpenAIServingResponses
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
from vllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from vllm.entrypoints.openai.serving_models import (
    BaseModelPath,
    LoRAModulePath,
    OpenAIServingModels,
)
from vllm.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from vllm.entrypoints.openai.utils import respond, validate_json_request
from vllm.entrypoints.pooling import init_pooling_state, register_pooling_api_routers
from vllm.entrypoints.serve import register_vllm_serve_api_routers
from vllm.entrypoints.serve.instrumentator.health import engine_clients, health

# Starlette's, except that it never fails on a lone surrogate (see there).
from vllm.entrypoints.utils import Utf8JSONResponse as JSONResponse
from vllm.entrypoints.utils import with_cancellation
from vllm.logger import init_logger
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError, QueueOverflowError

logger = init_logger("vllm.entrypoints.openai.api_server")

# Paths that answer without an API key: liveness, version and API docs. Every
# other path (inference, tokenization, metrics, unknown ones) needs the key.
UNGUARDED_PATHS = frozenset(
    {"/health", "/ping", "/version", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
)
# Seconds between two periodic stats log lines.
LOG_STATS_INTERVAL_S = 10.0

router = APIRouter()


# ----------------------------------------------------------------------
# Routes
# ----------------------------------------------------------------------


@router.get("/ping", response_class=Response, responses=HEALTH_RESPONSES)
async def ping(raw_request: Request) -> Response:
    """Liveness, as /health (SageMaker probes this path)."""
    return await health(raw_request)


# A route of its own per method: one operation id each in /openapi.json.
@router.post("/ping", response_class=Response, responses=HEALTH_RESPONSES)
async def ping_post(raw_request: Request) -> Response:
    """Liveness, as /health (SageMaker probes this path)."""
    return await health(raw_request)


@router.get("/v1/models", response_model=ModelList)
async def show_available_models(raw_request: Request) -> JSONResponse:
    models = await raw_request.app.state.openai_serving_models.show_available_models()
    return JSONResponse(content=models.model_dump())


@router.post(
    "/v1/completions",
    dependencies=[Depends(validate_json_request)],
    response_model=CompletionResponse,
    responses=GENERATE_RESPONSES,
)
@with_cancellation
async def create_completion(request: CompletionRequest, raw_request: Request) -> Response:
    handler: OpenAIServingCompletion = raw_request.app.state.openai_serving_completion
    return respond(await handler.create_completion(request, raw_request))


@router.post(
    "/v1/chat/completions",
    dependencies=[Depends(validate_json_request)],
    response_model=ChatCompletionResponse,
    responses=GENERATE_RESPONSES,
)
@with_cancellation
async def create_chat_completion(request: ChatCompletionRequest, raw_request: Request) -> Response:
    handler: OpenAIServingChat = raw_request.app.state.openai_serving_chat
    return respond(await handler.create_chat_completion(request, raw_request))


@router.post(
    "/invocations",
    dependencies=[Depends(validate_json_request)],
    responses=INVOCATIONS_RESPONSES,
    openapi_extra=INVOCATIONS_OPENAPI,
)
async def invocations(raw_request: Request) -> Response:
    """SageMaker's single route: a chat body or a completion body."""
    try:
        body = await raw_request.json()
    except ValueError as e:
        raise RequestValidationError(errors=[f"JSON decode error: {e}"]) from e
    request_cls: type[pydantic.BaseModel]
    if isinstance(body, dict) and "messages" in body:
        request_cls, route = ChatCompletionRequest, create_chat_completion
    elif isinstance(body, dict) and "prompt" in body:
        request_cls, route = CompletionRequest, create_completion
    else:
        raise RequestValidationError(
            errors=[
                (
                    "Cannot determine the request type: expected a chat body (messages) or "
                    "a completion body (prompt)"
                )
            ]
        )
    try:
        request = request_cls.model_validate(body)
    except pydantic.ValidationError as e:
        raise RequestValidationError(errors=e.errors()) from e
    return await route(request, raw_request)


# ----------------------------------------------------------------------
# Errors and authentication
# ----------------------------------------------------------------------


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


def _install_exception_handlers(app: FastAPI) -> None:
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


# ----------------------------------------------------------------------
# App and server
# ----------------------------------------------------------------------


def build_app(args: Namespace, supported_tasks: tuple[str, ...] = ("generate",)) -> FastAPI:
    """The FastAPI app: routes, CORS, the API-key check, error handlers.
    The pooling routes are added for the tasks the model supports."""
    root_path = args.root_path or ""
    if args.disable_fastapi_docs:
        app = FastAPI(
            lifespan=_lifespan,
            root_path=root_path,
            openapi_url=None,
            docs_url=None,
            redoc_url=None,
        )
    else:
        app = FastAPI(lifespan=_lifespan, root_path=root_path)
    register_vllm_serve_api_routers(app)
    app.include_router(router)
    attach_anthropic_router(app)
    attach_responses(app)
    register_pooling_api_routers(app, supported_tasks)
    app.root_path = root_path
    # Innermost of the three: the API key is checked before any body is read,
    # and a 413 still carries the CORS headers.
    app.add_middleware(RequestBodyLimitMiddleware)
    app.add_middleware(
        CORSMiddleware,
        allow_origins=args.allowed_origins,
        allow_credentials=args.allow_credentials,
        allow_methods=args.allowed_methods,
        allow_headers=args.allowed_headers,
    )
    tokens = [*(args.api_key or [])]
    if envs.VLLM_API_KEY:
        tokens.append(envs.VLLM_API_KEY)
    if tokens:
        app.add_middleware(AuthenticationMiddleware, tokens=tokens)
    install_openapi(app, guarded=bool(tokens), unguarded_paths=UNGUARDED_PATHS)
    _install_exception_handlers(app)
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    tasks = []
    if getattr(app.state, "log_stats", False):

        async def log_stats() -> None:
            while True:
                await asyncio.sleep(LOG_STATS_INTERVAL_S)
                await app.state.engine_client.do_log_stats()

        tasks.append(asyncio.create_task(log_stats()))
    if getattr(app.state, "embedding_engine_client", None) is not None:
        tasks.append(asyncio.create_task(embedding_watchdog(app.state)))
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()


async def init_app_state(
    engine_client: EngineClient,
    state: Any,
    args: Namespace,
    embedding_engine: EngineClient | None = None,
) -> None:
    """Create the serving objects the routes use. With `embedding_engine`
    (--embedding-model), the pooling routes' objects are built on it."""
    model_config = engine_client.model_config
    served = args.served_model_name
    names = ([served] if isinstance(served, str) else served) or [model_config.model]
    models = await _serving_models(engine_client, names, args.lora_modules)
    await models.init_static_loras()
    chat_template = load_chat_template(args.chat_template)
    common = dict(
        enable_force_include_usage=args.enable_force_include_usage,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
    )
    state.engine_client = engine_client
    state.embedding_engine_client = embedding_engine
    max_len = max(engine.model_config.max_model_len for engine in engine_clients(state))
    state.max_request_body_bytes = args.max_request_body_bytes or default_max_request_body_bytes(
        max_len
    )
    if not model_config.skip_tokenizer_init:
        prompt_length_bound(await engine_client.get_tokenizer())  # computed once, now
    state.log_stats = not args.disable_log_stats
    state.vllm_config = engine_client.vllm_config
    state.openai_serving_models = models
    state.openai_serving_chat = OpenAIServingChat(
        engine_client,
        models,
        args.response_role,
        chat_template=chat_template,
        trust_request_chat_template=args.trust_request_chat_template,
        enable_auto_tools=args.enable_auto_tool_choice,
        tool_parser=args.tool_call_parser,
        exclude_tools_when_tool_choice_none=args.exclude_tools_when_tool_choice_none,
        reasoning_parser=args.reasoning_parser,
        **common,
    )
    state.openai_serving_completion = OpenAIServingCompletion(engine_client, models, **common)
    state.openai_serving_responses = OpenAIServingResponses(
        engine_client, models, state.openai_serving_chat, **common
    )
    state.openai_serving_tokenization = OpenAIServingTokenization(
        engine_client,
        models,
        chat_template=chat_template,
        trust_request_chat_template=args.trust_request_chat_template,
    )
    state.anthropic_serving_messages = AnthropicServingMessages(
        state.openai_serving_chat, state.openai_serving_tokenization
    )
    if embedding_engine is None:
        init_pooling_state(engine_client, state, models, await engine_client.get_supported_tasks())
        return
    embed_models = await _serving_models(embedding_engine, embedding_served_names(args))
    models.link_peer(embed_models)
    if not embedding_engine.model_config.skip_tokenizer_init:
        prompt_length_bound(await embedding_engine.get_tokenizer())
    init_pooling_state(
        embedding_engine,
        state,
        embed_models,
        await embedding_engine.get_supported_tasks(),
        chat_template=load_chat_template(args.embedding_chat_template),
    )


async def _serving_models(
    engine: EngineClient, names: list[str], lora_modules: list[LoRAModulePath] | None = None
) -> OpenAIServingModels:
    paths = [BaseModelPath(name=name, model_path=engine.model_config.model) for name in names]
    return OpenAIServingModels(
        engine, paths, await engine.get_supported_tasks(), lora_modules=lora_modules
    )


@asynccontextmanager
async def build_async_engine_client(args: Namespace) -> AsyncIterator[EngineClient]:
    """Start AsyncLLM (its engine core in a child process); shut it down on exit."""
    engine_args = AsyncEngineArgs.from_cli_args(args)
    vllm_config = engine_args.create_engine_config(UsageContext.OPENAI_API_SERVER)
    check_main_model(args, vllm_config.model_config)
    engine = start_async_llm(vllm_config, args, engine_args.disable_log_stats)
    try:
        yield engine
    finally:
        engine.shutdown()


def create_server_socket(host: str | None, port: int) -> socket.socket:
    """Bind early: the port is ours before the (slow) engine start-up."""
    family = socket.AF_INET6 if host and ":" in host else socket.AF_INET
    sock = socket.socket(family=family, type=socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host or "", port))
    return sock


async def run_server(args: Namespace, **uvicorn_kwargs: Any) -> None:
    """Run a single-worker API server."""
    sock = create_server_socket(args.host, args.port)

    def interrupt(signum: int, frame: Any) -> None:
        # During start-up: unwind (the engine process is stopped on the way out).
        raise KeyboardInterrupt(f"terminated by signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    try:
        async with (
            build_async_engine_client(args) as engine,
            build_embedding_engine_client(args) as embedding_engine,
        ):
            pooling_engine = embedding_engine or engine
            app = build_app(args, await pooling_engine.get_supported_tasks())
            await init_app_state(engine, app.state, args, embedding_engine)
            logger.info(
                "Starting vLLM API server on http://%s:%d", args.host or "0.0.0.0", args.port
            )
            await serve_http(
                app,
                sock,
                log_level=args.uvicorn_log_level,
                access_log=not args.disable_uvicorn_access_log,
                timeout_keep_alive=envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE,
                # uvicorn logs an error for a zero timeout even when
                # nothing is in flight; a tenth of a second is "no wait".
                timeout_graceful_shutdown=max(args.shutdown_timeout, 0.1),
                **uvicorn_kwargs,
            )
    finally:
        sock.close()
