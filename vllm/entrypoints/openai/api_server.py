"""The OpenAI-compatible API server (upstream: vllm/entrypoints/openai/api_server.py).

    run_server(args): bind the socket (setup_server) -> run_server_worker:
    AsyncLLM (engine core in a child process) -> build_app(args) ->
    init_app_state(...) -> uvicorn.

With --api-server-count N (vllm/entrypoints/cli/serve.py) the parent binds
the socket and starts the engine cores; each of N processes runs
run_api_server_worker_proc -> run_server_worker on the shared socket, with
an AsyncLLM that is one client of the running engines (client_config).

With --embedding-model a second AsyncLLM serves the pooling routes
(embedding_model.py): `build_embedding_engine_client`, the pooling serving
objects built on it in `init_app_state`, /health and the watchdog over both.

Routes here: /v1/completions, /v1/chat/completions, /v1/models, /invocations,
/ping; from vllm/entrypoints/serve/: /health, /version, /metrics, /tokenize,
/detokenize, the playground page at / (unless --disable-playground), and
with VLLM_ALLOW_RUNTIME_LORA_UPDATING /v1/load_lora_adapter and
/v1/unload_lora_adapter (response helpers in openai/utils.py). The
--lora-modules adapters are loaded before the server answers; a request's
`model` selects one by name (serving_models.py). Errors use the
envelope {"error": {"message", "type", "param", "code"}} with the HTTP status
equal to `code`; request validation errors are 400 (never 422).

With --api-key (or VLLM_API_KEY), every route is guarded except the paths in
UNGUARDED_PATHS: the check is on the exact raw path, so `//v1`, `%2Fv1` or
`/v1/../v1` spellings cannot slip past it (AuthenticationMiddleware and the
error handlers: vllm/entrypoints/serve/utils/server_utils.py).
"""

from __future__ import annotations

import asyncio
import signal
import socket
from argparse import Namespace
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pydantic
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response

import vllm.envs as envs
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.engine.protocol import EngineClient
from vllm.entrypoints.anthropic.api_router import attach_router as attach_anthropic_router
from vllm.entrypoints.anthropic.serving_messages import AnthropicServingMessages
from vllm.entrypoints.chat_utils import load_chat_template
from vllm.entrypoints.launcher import serve_http
from vllm.entrypoints.openai.cli_args import validate_parser_args
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
from vllm.entrypoints.serve.playground.api_router import attach_router as attach_playground
from vllm.entrypoints.serve.utils.server_utils import (
    UNGUARDED_PATHS,
    AuthenticationMiddleware,
    init_exception_handler,
)

# Starlette's, except that it never fails on a lone surrogate (see there).
from vllm.entrypoints.utils import Utf8JSONResponse as JSONResponse
from vllm.entrypoints.utils import with_cancellation
from vllm.logger import init_logger
from vllm.usage.usage_lib import UsageContext
from vllm.utils.system_utils import exit_skipping_teardown, parent_only
from vllm.v1.engine.ipc import watch_parent

logger = init_logger("vllm.entrypoints.openai.api_server")

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
    if not args.disable_playground:
        attach_playground(app)
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
    init_exception_handler(app)
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
async def build_async_engine_client(
    args: Namespace, client_config: dict[str, Any] | None = None
) -> AsyncIterator[EngineClient]:
    """Start AsyncLLM (its engine core in a child process); shut it down on exit.

    With `client_config` (one of N API servers, see vllm/v1/utils.py) the
    engine cores run already, started by the parent: AsyncLLM binds its
    sockets at the given addresses and is client `client_index` of
    `client_count`."""
    engine_args = AsyncEngineArgs.from_cli_args(args)
    client_config = dict(client_config or {})
    if client_config:
        engine_args._api_process_count = client_config["client_count"]
        engine_args._api_process_rank = client_config["client_index"]
    vllm_config = engine_args.create_engine_config(UsageContext.OPENAI_API_SERVER)
    check_main_model(args, vllm_config.model_config)
    ready_info = client_config.pop("engine_ready_info", None)
    if ready_info is not None:
        # What the running engines decided at start-up (their READY handshake).
        assert vllm_config.model_config is not None
        vllm_config.cache_config.num_gpu_blocks = ready_info["num_gpu_blocks"]
        vllm_config.model_config.max_model_len = ready_info["max_model_len"]
        vllm_config.scheduler_config.max_model_len = ready_info["max_model_len"]
    engine = start_async_llm(vllm_config, args, engine_args.disable_log_stats, client_config)
    try:
        yield engine
    finally:
        engine.shutdown()


def create_server_socket(host: str | None, port: int, reuse_port: bool = False) -> socket.socket:
    """Bind early: the port is ours before the (slow) engine start-up."""
    family = socket.AF_INET6 if host and ":" in host else socket.AF_INET
    sock = socket.socket(family=family, type=socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host or "", port))
    return parent_only(sock)  # forked engine cores close their copy


def setup_server(args: Namespace, *, reuse_port: bool) -> tuple[str, socket.socket]:
    """Bind the server socket; returns (listen address, socket). With N API
    servers the parent binds it once and every server accepts on it."""
    sock = create_server_socket(args.host, args.port, reuse_port=reuse_port)
    host = args.host or "0.0.0.0"
    host_part = f"[{host}]" if ":" in host else host
    return f"http://{host_part}:{args.port}", sock


async def run_server(args: Namespace, **uvicorn_kwargs: Any) -> None:
    """Run a single-worker API server."""
    listen_address, sock = setup_server(args, reuse_port=False)
    await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)


async def run_server_worker(
    listen_address: str,
    sock: socket.socket,
    args: Namespace,
    client_config: dict[str, Any] | None = None,
    **uvicorn_kwargs: Any,
) -> None:
    """Run one API server on `sock`: the only one (run_server), or one of N
    (client_config, in a process of its own: run_api_server_worker_proc)."""

    def interrupt(signum: int, frame: Any) -> None:
        # During start-up: unwind (the engine process is stopped on the way out).
        raise KeyboardInterrupt(f"terminated by signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    try:
        async with (
            build_async_engine_client(args, client_config) as engine,
            build_embedding_engine_client(args) as embedding_engine,
        ):
            pooling_engine = embedding_engine or engine
            app = build_app(args, await pooling_engine.get_supported_tasks())
            await init_app_state(engine, app.state, args, embedding_engine)
            logger.info("Starting vLLM API server on %s", listen_address)
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


def run_api_server_worker_proc(
    listen_address: str,
    sock: socket.socket,
    args: Namespace,
    client_config: dict[str, Any] | None = None,
    **uvicorn_kwargs: Any,
) -> None:
    """Entry point of each API server process of `--api-server-count N`
    (upstream keeps it in vllm/v1/utils.py; see the note there)."""
    client_config = dict(client_config or {})
    death_pipe = client_config.pop("death_pipe", None)
    if death_pipe is not None:
        watch_parent(death_pipe)
    # The parent loaded these into its own interpreter only.
    validate_parser_args(args)
    try:
        asyncio.run(run_server_worker(listen_address, sock, args, client_config, **uvicorn_kwargs))
    except KeyboardInterrupt:
        logger.info("API server %s interrupted during start-up.", client_config.get("client_index"))
    # Everything is shut down (sockets closed, the engine client released):
    # end the process without the interpreter's teardown (over 5 s of GC on a
    # loaded 2-core machine, longer than the parent waits before it kills a
    # server); the parent owns the atexit work.
    exit_skipping_teardown(0, run_exit_hooks=False)
