"""`/v1/responses` (upstream: vllm/entrypoints/openai/responses/serving.py).

A Responses request runs as a chat completion: its input, instructions and
tools become a ChatCompletionRequest (utils.py) that OpenAIServingChat serves
with the server's chat template, tool parser (--tool-call-parser) and
reasoning parser (--reasoning-parser), exactly as /v1/chat/completions; the
chat result comes back as output items (streaming_events.py): `reasoning`,
`message` (output_text), `function_call`.

- Streaming: response.created, response.in_progress, the items' events,
  response.completed (its `response` is the final object); an error after the
  stream began is an `error` event. Every event has a `sequence_number`.
- `finish_reason: "length"` -> status "incomplete" (max_output_tokens).
- Store (store.py): with VLLM_ENABLE_RESPONSES_API_STORE=1, `store: true`
  keeps the response for GET /v1/responses/{id} and `previous_response_id`;
  `background: true` answers "queued" at once (with `stream`, the events as
  they come; GET with `stream=true&starting_after=N` replays them) and runs in
  a task that POST /v1/responses/{id}/cancel cancels. Without it `store` is
  ignored (upstream) and `background` is a 400.
- Refused (400, naming the field): `prompt`, `max_tool_calls`,
  `truncation: "auto"`, `previous_input_messages`, `enable_response_messages`,
  `mm_processor_kwargs`, `conversation`. Logged as
  ignored (upstream ignores them too): `reasoning` settings, `include` values
  other than message.output_text.logprobs, `text.verbosity`, a `service_tier`
  other than auto / default, `top_logprobs` without that include.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import pydantic
from starlette.requests import Request

import vllm.envs as envs
from vllm.entrypoints.openai.protocol import (
    ChatCompletionResponse,
    ErrorInfo,
    ErrorResponse,
    log_ignored_fields,
)
from vllm.entrypoints.openai.responses.protocol import (
    LOGPROBS_INCLUDE,
    ResponseError,
    ResponsesRequest,
    ResponsesResponse,
    ResponseUsage,
)
from vllm.entrypoints.openai.responses.store import (
    ACTIVE_STATUSES,
    ResponseStore,
    StoredResponse,
)
from vllm.entrypoints.openai.responses.streaming_events import (
    OutputBuilder,
    chat_chunks,
    sse,
    usage_from_chat,
)
from vllm.entrypoints.openai.responses.utils import (
    construct_input_messages,
    output_to_messages,
    to_chat_request,
)
from vllm.entrypoints.openai.serving_engine import OpenAIServing
from vllm.exceptions import VLLMValidationError
from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.engine.protocol import EngineClient
    from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
    from vllm.entrypoints.openai.serving_models import OpenAIServingModels

logger = init_logger(__name__)

# Chat's names for a request's fields -> the Responses names (error `param`s).
_PARAM_NAMES = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "logprobs": "include",
}
# Fields refused when set (their setting would otherwise be dropped).
_REFUSED = {
    "prompt": "prompt template is not supported",
    "max_tool_calls": "`max_tool_calls` is not supported",
    "previous_input_messages": "`previous_input_messages` is not supported",
    "mm_processor_kwargs": "`mm_processor_kwargs` is not supported: only text input is",
}


class OpenAIServingResponses(OpenAIServing):
    """Handles POST /v1/responses, GET /v1/responses/{id} and its cancel."""

    def __init__(
        self,
        engine_client: EngineClient,
        models: OpenAIServingModels,
        serving_chat: OpenAIServingChat,
        **kwargs: Any,
    ) -> None:
        super().__init__(engine_client, models, **kwargs)
        self.serving_chat = serving_chat
        self.enable_store = bool(envs.VLLM_ENABLE_RESPONSES_API_STORE)
        self.store = ResponseStore(envs.VLLM_RESPONSES_API_STORE_MAX_ENTRIES)

    # ------------------------------------------------------------------
    # Create
    # ------------------------------------------------------------------

    async def create_responses(
        self, request: ResponsesRequest, raw_request: Request | None = None
    ) -> AsyncGenerator[str, None] | ResponsesResponse | ErrorResponse:
        """Serve one request: a response, an SSE stream, or an error body."""
        error = await self._check_model(request) or self._check_request(request)
        if error is not None:
            return error
        if self.engine_client.errored:
            raise self.engine_client.dead_error
        if request.store and not self.enable_store:
            request.store = False  # upstream: `store` defaults to true, ignored here
        history: list[dict[str, Any]] | None = None
        if request.previous_response_id is not None:
            previous = self._previous(request.previous_response_id)
            if isinstance(previous, ErrorResponse):
                return previous
            history = previous.conversation
        try:
            messages, conversation = construct_input_messages(request, history)
            chat_request = to_chat_request(request, messages, stream=bool(request.stream))
        except (VLLMValidationError, pydantic.ValidationError) as e:
            return self._error(e)
        created_at = int(time.time())
        if request.background:
            return self._start_background(request, chat_request, conversation, created_at)
        result = await self.serving_chat.create_chat_completion(chat_request, raw_request)
        if isinstance(result, ErrorResponse):
            return self._rename_param(result)
        if isinstance(result, ChatCompletionResponse):
            response = self.response_from_chat(request, result, created_at)
            if request.store:
                self._finish(None, response, conversation)
            return response
        return self._stream(request, result, conversation, created_at)

    def _check_request(self, request: ResponsesRequest) -> ErrorResponse | None:
        for name, message in _REFUSED.items():
            if getattr(request, name) is not None:
                return self.create_error_response(message, param=name)
        if request.enable_response_messages:
            return self.create_error_response(
                "`enable_response_messages` is not supported", param="enable_response_messages"
            )
        if request.truncation == "auto":
            return self.create_error_response(
                '`truncation: "auto"` is not supported: a prompt that does not fit is refused.',
                param="truncation",
            )
        if (request.model_extra or {}).get("conversation") is not None:
            return self.create_error_response(
                "`conversation` is not supported: use `previous_response_id`.",
                param="conversation",
            )
        if request.background and not self.enable_store:
            return self.create_error_response(
                "This vLLM engine does not support `store=True` and therefore does not "
                "support the background mode. To enable these features, set the "
                "environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when "
                "launching the vLLM server.",
                param="background",
            )
        self._log_ignored(request)
        return None

    @staticmethod
    def _log_ignored(request: ResponsesRequest) -> None:
        """Upstream's warning for settings that change nothing here."""
        ignored = [f"include.{v}" for v in request.include or [] if v != LOGPROBS_INCLUDE]
        if request.reasoning is not None:
            ignored += [f"reasoning.{k}" for k in request.reasoning.model_dump(exclude_none=True)]
        if request.text is not None and request.text.verbosity is not None:
            ignored.append("text.verbosity")
        if request.service_tier not in ("auto", "default"):
            ignored.append("service_tier")
        if request.top_logprobs and not request.is_include_output_logprobs():
            ignored.append("top_logprobs")
        log_ignored_fields(ignored)

    def _previous(self, response_id: str) -> StoredResponse | ErrorResponse:
        entry = self.store.get(response_id) if self.enable_store else None
        if entry is None:
            return self._not_found(response_id, "previous_response_id")
        if entry.response.status in ACTIVE_STATUSES:
            return self.create_error_response(
                f"Response with id '{response_id}' is still {entry.response.status}.",
                param="previous_response_id",
            )
        return entry

    def _not_found(self, response_id: str, param: str = "response_id") -> ErrorResponse:
        message = f"Response with id '{response_id}' not found."
        if not self.enable_store:
            message += (
                " Responses are not stored by this server: set "
                "VLLM_ENABLE_RESPONSES_API_STORE=1 when launching it."
            )
        # Upstream's status: 404 (not 400).
        return self.create_error_response(
            message, "NotFoundError", HTTPStatus.NOT_FOUND, param=param
        )

    def _error(self, e: Exception) -> ErrorResponse:
        if isinstance(e, pydantic.ValidationError):
            errors = e.errors()
            loc = ".".join(str(x) for x in errors[0]["loc"]) if errors else ""
            message = f"{loc}: {errors[0]['msg']}" if loc else str(e)
            return self._rename_param(self.create_error_response(message, param=loc or None))
        return self._rename_param(self.error_from_exception(e))

    @staticmethod
    def _rename_param(error: ErrorResponse) -> ErrorResponse:
        param = error.error.param
        if param is not None:
            head, dot, rest = param.partition(".")
            if head in _PARAM_NAMES:
                error.error.param = _PARAM_NAMES[head] + dot + rest
        return error

    # ------------------------------------------------------------------
    # Results
    # ------------------------------------------------------------------

    def _response(
        self,
        request: ResponsesRequest,
        created_at: int,
        status: Any,
        output: list[dict[str, Any]] | None = None,
        usage: ResponseUsage | None = None,
        model_name: str | None = None,
    ) -> ResponsesResponse:
        return ResponsesResponse.from_request(
            request,
            model_name=model_name or self._get_model_name(request.model),
            created_at=created_at,
            status=status,
            sampling_defaults=self.default_sampling_params,
            output=output,
            usage=usage,
        )

    def response_from_chat(
        self, request: ResponsesRequest, chat: ChatCompletionResponse, created_at: int
    ) -> ResponsesResponse:
        """The response for a non-streamed chat result."""
        choice = chat.choices[0]
        message = choice.message.model_dump()
        message["tool_calls"] = [
            {**call, "index": i} for i, call in enumerate(message.get("tool_calls") or [])
        ]
        builder = OutputBuilder(request.is_include_output_logprobs())
        logprobs = choice.logprobs.model_dump() if choice.logprobs is not None else None
        builder.on_delta(message, logprobs)
        builder.finish()
        status = "incomplete" if choice.finish_reason == "length" else "completed"
        usage = usage_from_chat(chat.usage.model_dump())
        return self._response(request, created_at, status, builder.items, usage, chat.model)

    def _finish(
        self,
        entry: StoredResponse | None,
        response: ResponsesResponse,
        conversation: list[dict[str, Any]],
    ) -> None:
        """Store a finished response (in its background entry, unless that
        was cancelled meanwhile)."""
        history = [*conversation, *output_to_messages(response.output)]
        if entry is None:
            self.store.put(StoredResponse(response=response, conversation=history))
            return
        if entry.response.status == "cancelled":
            return
        entry.response, entry.conversation = response, history
        self.store.put(entry)

    async def _stream(
        self,
        request: ResponsesRequest,
        chat_stream: AsyncGenerator[str, None],
        conversation: list[dict[str, Any]],
        created_at: int,
        entry: StoredResponse | None = None,
    ) -> AsyncGenerator[str, None]:
        """The SSE events of a streamed response (see the module docstring)."""
        builder = OutputBuilder(request.is_include_output_logprobs())
        initial = self._response(request, created_at, "in_progress").model_dump()
        yield sse(builder.event("response.created", response=initial))
        yield sse(builder.event("response.in_progress", response=initial))
        usage: dict[str, Any] | None = None
        finish_reason = None
        try:
            async for chunk in chat_chunks(chat_stream):
                if "error" in chunk:
                    error = chunk["error"] or {}
                    yield sse(
                        builder.event(
                            "error",
                            code=str(error.get("type") or "InternalServerError"),
                            message=str(error.get("message") or "Internal server error"),
                            param=error.get("param"),
                        )
                    )
                    return
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or []:
                    finish_reason = choice.get("finish_reason") or finish_reason
                    for event in builder.on_delta(
                        choice.get("delta") or {}, choice.get("logprobs")
                    ):
                        yield sse(event)
        finally:
            await chat_stream.aclose()
        for event in builder.finish():
            yield sse(event)
        status = "incomplete" if finish_reason == "length" else "completed"
        response = self._response(
            request, created_at, status, builder.items, usage_from_chat(usage) if usage else None
        )
        if request.store:
            self._finish(entry, response, conversation)
        yield sse(builder.event("response.completed", response=response.model_dump()))

    # ------------------------------------------------------------------
    # Background, retrieve, cancel
    # ------------------------------------------------------------------

    def _start_background(
        self,
        request: ResponsesRequest,
        chat_request: Any,
        conversation: list[dict[str, Any]],
        created_at: int,
    ) -> ResponsesResponse | AsyncGenerator[str, None]:
        """Store the queued response and run it in a task: answer it at once,
        or (with `stream`) the task's events as they come."""
        response = self._response(request, created_at, "queued")
        entry = StoredResponse(response=response.model_copy(), conversation=conversation)
        if request.stream:
            entry.events, entry.new_event = [], asyncio.Event()
        self.store.put(entry)
        entry.task = asyncio.create_task(
            self._run_background(request, chat_request, entry, created_at),
            name=f"responses-background-{response.id}",
        )
        return entry.replay() if request.stream else response

    async def _run_background(
        self, request: ResponsesRequest, chat_request: Any, entry: StoredResponse, created_at: int
    ) -> None:
        entry.response.status = "in_progress"
        conversation = entry.conversation
        try:
            result = await self.serving_chat.create_chat_completion(chat_request, None)
            if isinstance(result, ChatCompletionResponse):
                self._finish(
                    entry, self.response_from_chat(request, result, created_at), conversation
                )
            elif isinstance(result, ErrorResponse):
                self._fail(request, entry, created_at, result.error)
            else:
                stream = self._stream(request, result, conversation, created_at, entry)
                async for frame in stream:
                    assert entry.events is not None and entry.new_event is not None
                    entry.events.append(frame)
                    entry.new_event.set()
                if entry.response.status in ACTIVE_STATUSES:  # it ended on an error event
                    failed = self._response(request, created_at, "failed")
                    self._finish(entry, failed, conversation)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            logger.exception("Background response %s failed", request.request_id)
            self._fail(request, entry, created_at, self.error_from_exception(e).error)
        finally:
            entry.task = None
            if entry.new_event is not None:
                entry.new_event.set()

    def _fail(
        self, request: ResponsesRequest, entry: StoredResponse, created_at: int, error: ErrorInfo
    ) -> None:
        """A background response failed: its status, and an `error` event
        for whoever streams it."""
        response = self._response(request, created_at, "failed")
        response.error = ResponseError(code=error.type, message=error.message)
        self._finish(entry, response, entry.conversation)
        if entry.events is not None:
            builder = OutputBuilder()
            builder.sequence_number = len(entry.events)
            event = builder.event(
                "error", code=error.type, message=error.message, param=error.param
            )
            entry.events.append(sse(event))

    async def retrieve_responses(
        self, response_id: str, starting_after: int | None = None, stream: bool | None = False
    ) -> ResponsesResponse | ErrorResponse | AsyncGenerator[str, None]:
        """A stored response; with `stream`, the events of a streamed
        background response after `starting_after` (then live ones)."""
        entry = self.store.get(response_id) if self.enable_store else None
        if entry is None:
            return self._not_found(response_id)
        if not stream:
            return entry.response
        if entry.events is None:
            return self.create_error_response(
                f"Response with id '{response_id}' was not streamed in the background: "
                "only those can be streamed again.",
                param="stream",
            )
        return entry.replay(starting_after)

    async def cancel_responses(self, response_id: str) -> ResponsesResponse | ErrorResponse:
        entry = self.store.get(response_id) if self.enable_store else None
        if entry is None:
            return self._not_found(response_id)
        if entry.response.status not in ACTIVE_STATUSES:
            # Upstream's message, for any finished response.
            return self.create_error_response(
                "Cannot cancel a synchronous response.", param="response_id"
            )
        entry.response.status = "cancelled"
        task = entry.task
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return entry.response
