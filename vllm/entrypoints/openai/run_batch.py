"""`vllm run-batch` (upstream: vllm/entrypoints/openai/run_batch.py): OpenAI
batch files, served by an in-process engine with the server's own handlers.

    vllm run-batch -i INPUT.jsonl -o OUTPUT.jsonl --model M [engine flags]

Each input line is one request, `{"custom_id", "method": "POST", "url",
"body"}`; url is `/v1/chat/completions`, `/v1/completions` or
`/v1/embeddings` (the last for a pooling model with task "embed"). Every
request is handed at once to the same serving objects `vllm serve` builds
(`init_app_state`), on one `AsyncLLM` without a queue limit, so the engine
batches them. The output has one line per non-blank input line, in input
order: `{"id", "custom_id", "response": {"status_code", "request_id",
"body"}, "error"}`.

A bad line fails alone, in its own output line (status_code 400, `body`
null, `error` set) and never the whole batch: invalid JSON or a line that is
not a request object (`custom_id` null when it cannot be read), a method
other than POST, an unknown url or one the model does not serve, a body the
endpoint refuses (the server's error envelope, as `error`), `stream: true`,
and whatever the handler refuses (e.g. a prompt longer than the model). An
engine failure is a 500 on each line it hits.

Deviations from upstream v0.28: there a malformed line (bad JSON, a body that
does not validate) aborts the whole batch, `/v1/completions` lines are
refused, and the method is not checked. Input and output are local files
only: http(s) URLs (upstream downloads the input and PUTs the output) are
refused before the engine starts, as are upstream's `--output-tmp-dir`
(unknown flag: it only serves URL uploads) and the Prometheus flags
(`--enable-metrics`, `--host`, `--port`, `--url`: not built here). Audio,
`/score` and `/rerank` lines are refused as unknown urls.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Any

import pydantic
from starlette.datastructures import State

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.engine.protocol import EngineClient
from vllm.entrypoints.openai.api_server import init_app_state
from vllm.entrypoints.openai.cli_args import (
    LoRAParserAction,
    _add_tool_and_reasoning_args,
    validate_lora_modules,
    validate_parser_args,
)
from vllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
)
from vllm.entrypoints.openai.protocol_base import ErrorInfo, ErrorResponse, OpenAIBaseModel
from vllm.entrypoints.pooling.embed.protocol import EmbeddingRequest, EmbeddingResponse
from vllm.entrypoints.serve.utils.server_utils import _validation_message
from vllm.logger import init_logger
from vllm.utils import random_uuid

logger = init_logger(__name__)

SUPPORTED_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")


class BatchRequestInput(OpenAIBaseModel):
    """One line of the input file. `body` is validated by its endpoint's
    request class (see `_ENDPOINTS`), so that a bad body is that line's error."""

    custom_id: str
    method: str
    url: str
    body: dict[str, Any]


class BatchResponseData(OpenAIBaseModel):
    status_code: int = 200
    request_id: str
    body: ChatCompletionResponse | CompletionResponse | EmbeddingResponse | None = None


class BatchRequestOutput(OpenAIBaseModel):
    """One line of the output file."""

    id: str
    # None only for a line that could not be read as a request object.
    custom_id: str | None
    response: BatchResponseData | None
    # The error envelope the server would answer (a request refused by its
    # handler), or a message (a line refused by the batch runner itself).
    error: ErrorResponse | str | None


# ----------------------------------------------------------------------
# Flags
# ----------------------------------------------------------------------


def make_arg_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """run-batch's own flags, the front-end flags that apply to a batch, and
    every engine flag."""
    group = parser.add_argument_group("Batch")
    group.add_argument(
        "-i", "--input-file", required=True, type=str, help="The batch file (JSONL) to read."
    )
    group.add_argument(
        "-o", "--output-file", required=True, type=str, help="The JSONL file to write results to."
    )
    group.add_argument("--chat-template", type=str, default=None, help="As `vllm serve`'s.")
    group.add_argument(
        "--trust-request-chat-template", action="store_true", help="As `vllm serve`'s."
    )
    group.add_argument(
        "--response-role", type=str, default="assistant", help="Role of generated chat messages."
    )
    group.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="Report prompt_tokens_details.cached_tokens in usage.",
    )
    group.add_argument(
        "--lora-modules",
        type=str,
        nargs="+",
        default=None,
        action=LoRAParserAction,
        help="LoRA adapters (needs --enable-lora), as `vllm serve`'s; a line's `model` "
        "selects one.",
    )
    _add_tool_and_reasoning_args(group)
    AsyncEngineArgs.add_cli_args(parser)
    # What init_app_state reads of the server's flags that a batch does not take.
    parser.set_defaults(
        max_request_body_bytes=None, enable_force_include_usage=False, embedding_model=None
    )
    return parser


def validate_run_batch_args(args: argparse.Namespace) -> None:
    """Checks that need no engine (ValueError): local input and output
    files, the parser names and plugins, the LoRA modules."""
    for flag, path in (("--input-file", args.input_file), ("--output-file", args.output_file)):
        if path.startswith(("http://", "https://")):
            raise ValueError(
                f"{flag} {path}: URLs are not supported here (no network access); use a local file"
            )
    if not os.path.isfile(args.input_file):
        raise ValueError(f"--input-file {args.input_file}: no such file")
    out_dir = os.path.dirname(os.path.abspath(args.output_file))
    if not os.path.isdir(out_dir):
        raise ValueError(f"--output-file {args.output_file}: no such directory {out_dir}")
    validate_parser_args(args)
    validate_lora_modules(args)


# ----------------------------------------------------------------------
# Lines
# ----------------------------------------------------------------------


def _output(
    custom_id: str | None,
    status: int = 200,
    body: Any = None,
    error: ErrorResponse | str | None = None,
) -> BatchRequestOutput:
    response = BatchResponseData(
        status_code=status, request_id=f"vllm-batch-{random_uuid()}", body=body
    )
    return BatchRequestOutput(
        id=f"vllm-{random_uuid()}", custom_id=custom_id, response=response, error=error
    )


def make_error_request_output(custom_id: str | None, message: str) -> BatchRequestOutput:
    """A line the batch runner refuses itself: 400 with the message."""
    return _output(custom_id, int(HTTPStatus.BAD_REQUEST), error=message)


def parse_line(line_no: int, text: str) -> BatchRequestInput | BatchRequestOutput:
    """The request on one input line, or that line's error output."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        return make_error_request_output(None, f"line {line_no}: invalid JSON: {e}")
    custom_id = data.get("custom_id") if isinstance(data, dict) else None
    custom_id = custom_id if isinstance(custom_id, str) else None
    try:
        request = BatchRequestInput.model_validate(data)
    except pydantic.ValidationError as e:
        message, _ = _validation_message(list(e.errors()))
        return make_error_request_output(
            custom_id, f"line {line_no}: not a batch request: {message}"
        )
    if request.method.upper() != "POST":
        return make_error_request_output(
            custom_id, f"line {line_no}: method {request.method!r}: only POST is supported"
        )
    return request


# ----------------------------------------------------------------------
# Endpoints
# ----------------------------------------------------------------------

Handler = Callable[[Any], Awaitable[Any]]


class _Endpoint:
    """One url: how its body validates, and its handler (None when the model
    does not serve it)."""

    def __init__(self, request_type: Any, handler: Handler | None) -> None:
        self.adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(request_type)
        self.handler = handler


def build_endpoint_registry(state: Any, supported_tasks: tuple[str, ...]) -> dict[str, _Endpoint]:
    """The urls a batch serves, on the serving objects `init_app_state` built."""
    generates = "generate" in supported_tasks
    chat = state.openai_serving_chat.create_chat_completion if generates else None
    completion = state.openai_serving_completion.create_completion if generates else None
    embedding = getattr(state, "openai_serving_embedding", None)
    return {
        "/v1/chat/completions": _Endpoint(ChatCompletionRequest, chat),
        "/v1/completions": _Endpoint(CompletionRequest, completion),
        "/v1/embeddings": _Endpoint(
            EmbeddingRequest, embedding.create_embedding if embedding is not None else None
        ),
    }


def _refused(e: pydantic.ValidationError) -> ErrorResponse:
    """The server's 400 envelope for a body that does not validate."""
    message, param = _validation_message(list(e.errors()))
    info = ErrorInfo(message=message, type=HTTPStatus.BAD_REQUEST.phrase, param=param, code=400)
    return ErrorResponse(error=info)


async def run_request(endpoint: _Endpoint, request: BatchRequestInput) -> BatchRequestOutput:
    """Validate the body, run it through its handler; never raises."""
    assert endpoint.handler is not None
    custom_id = request.custom_id
    try:
        body = endpoint.adapter.validate_python(request.body)
    except pydantic.ValidationError as e:
        error = _refused(e)
        return _output(custom_id, error.error.code, error=error)
    if getattr(body, "stream", False):
        return make_error_request_output(custom_id, "Request must not be sent in stream mode")
    try:
        result = await endpoint.handler(body)
    except Exception as e:  # an engine failure: this line's 500, the batch goes on
        logger.exception("Batch request %s failed", custom_id)
        info = ErrorInfo(message=str(e) or type(e).__name__, type="InternalServerError", code=500)
        return _output(custom_id, 500, error=ErrorResponse(error=info))
    if isinstance(result, ErrorResponse):
        return _output(custom_id, result.error.code, error=result)
    if isinstance(result, ChatCompletionResponse | CompletionResponse | EmbeddingResponse):
        return _output(custom_id, body=result)
    # A binary body (embeddings' encoding_format bytes / bytes_only).
    return make_error_request_output(
        custom_id, "This response format cannot be written to a JSONL file (use float or base64)"
    )


def dispatch(
    request: BatchRequestInput, registry: dict[str, _Endpoint]
) -> Awaitable[BatchRequestOutput] | BatchRequestOutput:
    endpoint = registry.get(request.url)
    if endpoint is None:
        return make_error_request_output(
            request.custom_id,
            f"URL {request.url} was used. Supported endpoints: {', '.join(SUPPORTED_URLS)}",
        )
    if endpoint.handler is None:
        return make_error_request_output(
            request.custom_id, f"Model does not support endpoint: {request.url}"
        )
    return run_request(endpoint, request)


async def _done(output: BatchRequestOutput) -> BatchRequestOutput:
    return output


async def run_batch(engine_client: EngineClient, args: argparse.Namespace) -> list[str]:
    """Run every line of the input file; write and return the output lines."""
    state = State()
    await init_app_state(engine_client, state, args)
    registry = build_endpoint_registry(state, await engine_client.get_supported_tasks())
    with open(args.input_file, encoding="utf-8") as f:
        lines = f.read().splitlines()
    logger.info("Read %d lines from %s", len(lines), args.input_file)
    jobs: list[Awaitable[BatchRequestOutput]] = []
    for line_no, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        parsed = parse_line(line_no, text)
        job = dispatch(parsed, registry) if isinstance(parsed, BatchRequestInput) else parsed
        jobs.append(_done(job) if isinstance(job, BatchRequestOutput) else job)
    outputs = await asyncio.gather(*jobs)
    rendered = [o.model_dump_json() for o in outputs]
    with open(args.output_file, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in rendered)
    failed = sum(o.error is not None for o in outputs)
    logger.info("Wrote %d results (%d errors) to %s", len(outputs), failed, args.output_file)
    return rendered


@asynccontextmanager
async def build_batch_engine_client(args: argparse.Namespace) -> AsyncIterator[EngineClient]:
    """AsyncLLM for a batch: no queue limit (every line is admitted at once)."""
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    engine_args = AsyncEngineArgs.from_cli_args(args)
    vllm_config = engine_args.create_engine_config(UsageContext.OPENAI_BATCH_RUNNER)
    engine = AsyncLLM.from_vllm_config(
        vllm_config,
        usage_context=UsageContext.OPENAI_BATCH_RUNNER,
        enable_log_requests=getattr(args, "enable_log_requests", False),
        disable_log_stats=engine_args.disable_log_stats,
        max_num_queued_reqs=None,
    )
    try:
        yield engine
    finally:
        engine.shutdown()


async def main(args: argparse.Namespace) -> None:
    """Run the batch (the flags checked already: `validate_run_batch_args`)."""
    async with build_batch_engine_client(args) as engine_client:
        await run_batch(engine_client, args)
