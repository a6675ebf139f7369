"""What the OpenAI serving classes share (upstream:
vllm/entrypoints/openai/serving_engine.py): model check, error bodies,
context-length validation, sampling parameters from a request, logprob
formatting and merging the streams of several prompts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.requests import Request

from vllm.beam_search import BeamSearchInstance, BeamSearchSequence, create_sort_beams_key_function
from vllm.entrypoints.openai.protocol import (
    LOGPROB_FLOOR,
    ChatCompletionRequest,
    CompletionRequest,
    ErrorInfo,
    ErrorResponse,
    PromptTokenUsageInfo,
    UsageInfo,
)
from vllm.exceptions import VLLMClientError, VLLMNotFoundError, VLLMValidationError
from vllm.inputs import TokensPrompt
from vllm.logger import init_logger
from vllm.logprobs import Logprob
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import (
    BeamSearchParams,
    RequestOutputKind,
    SamplingParams,
    StructuredOutputsParams,
)
from vllm.tracing import (
    contains_trace_headers,
    extract_trace_headers,
    log_tracing_disabled_warning,
)
from vllm.v1.engine.exceptions import EngineDeadError, QueueOverflowError

if TYPE_CHECKING:
    from vllm.engine.protocol import EngineClient
    from vllm.entrypoints.openai.serving_models import OpenAIServingModels
    from vllm.lora.request import LoRARequest
    from vllm.tokenizers import TokenizerLike

logger = init_logger(__name__)

T = TypeVar("T")

# OpenAI's defaults for what neither the request nor generation_config.json sets.
_DEFAULT_SAMPLING_PARAMS = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
}


class GenerationError(Exception):
    """The engine finished a request with finish_reason "error"."""

    def __init__(self, message: str = "Internal server error") -> None:
        super().__init__(message)
        self.status_code = HTTPStatus.INTERNAL_SERVER_ERROR


class OpenAIServing:
    """Base class of the route handlers that run the model."""

    def __init__(
        self,
        engine_client: EngineClient,
        models: OpenAIServingModels,
        *,
        enable_force_include_usage: bool = False,
        enable_prompt_tokens_details: bool = False,
    ) -> None:
        self.engine_client = engine_client
        self.models = models
        self.model_config = engine_client.model_config
        self.max_model_len = self.model_config.max_model_len
        self.enable_force_include_usage = enable_force_include_usage
        self.enable_prompt_tokens_details = enable_prompt_tokens_details
        self.default_sampling_params = self.model_config.get_diff_sampling_param()

    def usage_info(
        self, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
    ) -> UsageInfo:
        """A response's usage; with --enable-prompt-tokens-details its
        prompt_tokens_details.cached_tokens too (the final usage of both routes,
        streamed or not, as upstream)."""
        usage = UsageInfo(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )
        if self.enable_prompt_tokens_details and cached_tokens is not None:
            usage.prompt_tokens_details = PromptTokenUsageInfo(cached_tokens=cached_tokens)
        return usage

    # ------------------------------------------------------------------
    # Errors
    # ------------------------------------------------------------------

    @staticmethod
    def create_error_response(
        message: str,
        err_type: str = "BadRequestError",
        status_code: HTTPStatus = HTTPStatus.BAD_REQUEST,
        param: str | None = None,
    ) -> ErrorResponse:
        return ErrorResponse(
            error=ErrorInfo(message=message, type=err_type, param=param, code=int(status_code))
        )

    def create_streaming_error_response(
        self,
        message: str,
        err_type: str = "BadRequestError",
        status_code: HTTPStatus = HTTPStatus.BAD_REQUEST,
    ) -> str:
        return json.dumps(self.create_error_response(message, err_type, status_code).model_dump())

    def error_from_exception(
        self, e: Exception, request: CompletionRequest | ChatCompletionRequest | None = None
    ) -> ErrorResponse:
        """Map an exception raised while serving a request to its error body.

        With `request`, a structured-output error names the field the client
        used (`response_format` or `structured_outputs`)."""
        if isinstance(e, VLLMValidationError):
            param = e.parameter
            if param == "structured_outputs" and request is not None:
                param = self._where_constrained(request)
            return self.create_error_response(str(e), param=param)
        if isinstance(e, VLLMNotFoundError):
            return self.create_error_response(str(e), "NotFoundError", HTTPStatus.NOT_FOUND)
        if isinstance(e, (VLLMClientError, ValueError, TypeError, OverflowError)):
            return self.create_error_response(str(e))
        if isinstance(e, NotImplementedError):
            return self.create_error_response(
                str(e), "NotImplementedError", HTTPStatus.NOT_IMPLEMENTED
            )
        if isinstance(e, QueueOverflowError):
            return self.create_error_response(
                str(e), "ServiceUnavailableError", HTTPStatus.SERVICE_UNAVAILABLE
            )
        if isinstance(e, GenerationError):
            return self.create_error_response(
                str(e), "InternalServerError", HTTPStatus.INTERNAL_SERVER_ERROR
            )
        if isinstance(e, EngineDeadError):
            # AsyncLLM has logged the death once; a traceback per request in
            # flight (dozens under load) would bury that line.
            logger.error("Request failed: %s", e)
        else:
            logger.exception("Error in request")
        return self.create_error_response(
            str(e) or type(e).__name__, "InternalServerError", HTTPStatus.INTERNAL_SERVER_ERROR
        )

    async def _check_model(self, request: Any) -> ErrorResponse | None:
        """None when `request.model` is unset, a served name or a loaded LoRA
        adapter's name; else the 404 (a 400 naming the right API when another
        engine of this server serves it)."""
        if request.model is None or self.models.is_base_model(request.model):
            return None
        if request.model in self.models.lora_requests:
            return None
        if (message := self.models.wrong_api_message(request.model)) is not None:
            # Another engine of this server serves it (`vllm serve --embedding-model`).
            return self.create_error_response(message, param="model")
        return self.create_error_response(
            f"The model `{request.model}` does not exist.",
            err_type="NotFoundError",
            status_code=HTTPStatus.NOT_FOUND,
            param="model",
        )

    def _maybe_get_adapters(self, request: Any) -> LoRARequest | None:
        """The LoRA adapter `request.model` names (None: the base model).

        Call it right after `_check_model` with no `await` in between: the
        adapter cannot be unloaded in that gap, so a name `_check_model`
        accepted is either a served name or an adapter here. The request keeps
        this LoRARequest to its end, even if the adapter is unloaded meanwhile
        (unloading only affects requests that arrive later)."""
        return self.models.lora_requests.get(request.model) if request.model else None

    def _get_model_name(self, model_name: str | None) -> str:
        return model_name if model_name else self.models.base_model_paths[0].name

    @staticmethod
    def _base_request_id(raw_request: Request | None, default: str) -> str:
        """The client's X-Request-Id header, else the request's id."""
        if raw_request is None:
            return default
        return raw_request.headers.get("X-Request-Id") or default

    async def _get_trace_headers(self, raw_request: Request | None) -> dict[str, str] | None:
        """The request's W3C trace headers when tracing is on (its span becomes
        a child of the caller's); ignored, with one warning, when it is off."""
        if raw_request is None:
            return None
        headers = raw_request.headers
        if await self.engine_client.is_tracing_enabled():
            return extract_trace_headers(headers)
        if contains_trace_headers(headers):
            log_tracing_disabled_warning()
        return None

    def _check_capacity(self, num_sequences: int) -> None:
        """A request that needs more sequences than the engine ever admits at
        once (`--max-num-queued-reqs`) can never run: that is the request's
        fault (400), not a busy server (503, which clients would retry)."""
        limit = getattr(self.engine_client, "max_num_queued_reqs", None)
        if limit is not None and num_sequences > limit:
            raise VLLMValidationError(
                f"The request needs {num_sequences} sequences (n times the number of "
                f"prompts), more than this server ever admits at once ({limit}).",
                parameter="n",
                value=num_sequences,
            )

    # ------------------------------------------------------------------
    # Prompts
    # ------------------------------------------------------------------

    def _validate_input(self, input_ids: list[int], max_tokens: int | None) -> None:
        """Prompt plus max_tokens must fit the context (upstream's messages)."""
        token_num = len(input_ids)
        if max_tokens is None:
            if token_num >= self.max_model_len:
                raise VLLMValidationError(
                    f"This model's maximum context length is {self.max_model_len} tokens. "
                    f"However, your request has {token_num} input tokens. Please reduce the "
                    "length of the input messages.",
                    parameter="messages",
                )
        elif token_num + max_tokens > self.max_model_len:
            raise VLLMValidationError(
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This "
                f"model's maximum context length is {self.max_model_len} tokens and your "
                f"request has {token_num} input tokens ({max_tokens} > {self.max_model_len}"
                f" - {token_num}).",
                parameter="max_tokens",
            )

    @staticmethod
    def _truncate(
        ids: list[int], truncate_prompt_tokens: int | None, max_model_len: int
    ) -> list[int]:
        if truncate_prompt_tokens is None:
            return ids
        keep = max_model_len if truncate_prompt_tokens == -1 else truncate_prompt_tokens
        return ids[-keep:] if keep else []

    def get_max_tokens(self, input_length: int, requested: int | None) -> int:
        """min(request's max_tokens, room left in the context, generation-config cap)."""
        candidates = [self.max_model_len - input_length]
        if requested is not None:
            candidates.append(requested)
        default = self.default_sampling_params.get("max_tokens")
        if default is not None:
            candidates.append(default)
        return max(min(candidates), 0)

    # ------------------------------------------------------------------
    # Sampling parameters
    # ------------------------------------------------------------------

    def build_sampling_params(
        self,
        request: CompletionRequest | ChatCompletionRequest,
        max_tokens: int,
        logprobs: int | None,
        prompt_logprobs: int | None,
    ) -> SamplingParams:
        """Request value > generation-config default > OpenAI default."""
        defaults = {**_DEFAULT_SAMPLING_PARAMS, **self.default_sampling_params}

        def pick(name: str) -> Any:
            value = getattr(request, name)
            return value if value is not None else defaults.get(name)

        logit_bias = None
        if request.logit_bias:
            try:
                logit_bias = {
                    int(k): min(100.0, max(-100.0, float(v))) for k, v in request.logit_bias.items()
                }
            except ValueError as e:
                raise VLLMValidationError(
                    f"logit_bias keys must be token ids: {e}", parameter="logit_bias"
                ) from e
            # The clamp would silently turn NaN (JSON may carry it) into -100.
            if any(math.isnan(v) for v in request.logit_bias.values()):
                raise VLLMValidationError(
                    "logit_bias values must be numbers, not NaN.", parameter="logit_bias"
                )
        return SamplingParams.from_optional(
            n=request.n,
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
            repetition_penalty=pick("repetition_penalty"),
            temperature=pick("temperature"),
            top_p=pick("top_p"),
            top_k=pick("top_k"),
            min_p=pick("min_p"),
            seed=request.seed,
            stop=request.stop,
            stop_token_ids=request.stop_token_ids,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            ignore_eos=request.ignore_eos,
            max_tokens=max_tokens,
            min_tokens=request.min_tokens,
            skip_special_tokens=request.skip_special_tokens,
            spaces_between_special_tokens=request.spaces_between_special_tokens,
            include_stop_str_in_output=request.include_stop_str_in_output,
            output_kind=(
                RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY
            ),
            logit_bias=logit_bias,
            allowed_token_ids=request.allowed_token_ids,
            bad_words=request.bad_words or None,
            extra_args=request.vllm_xargs,
            structured_outputs=self._structured_outputs(request),
        )

    @staticmethod
    def _structured_outputs(
        request: CompletionRequest | ChatCompletionRequest,
    ) -> StructuredOutputsParams | None:
        """The request's constraint: `structured_outputs`, else the one its
        `response_format` asks for (the protocol refuses both at once). A copy:
        the engine front end records the chosen backend on it."""
        if request.structured_outputs is not None:
            return dataclasses.replace(request.structured_outputs)
        if request.response_format is not None:
            return request.response_format.to_structured_outputs()
        return None

    @staticmethod
    def _where_constrained(request: CompletionRequest | ChatCompletionRequest) -> str:
        """The request field a structured-output error is about."""
        if request.structured_outputs is None and request.response_format is not None:
            return "response_format"
        return "structured_outputs"

    # ------------------------------------------------------------------
    # Beam search (`use_beam_search` on completions and chat)
    # ------------------------------------------------------------------

    async def beam_search(
        self,
        prompt: TokensPrompt,
        request_id: str,
        params: BeamSearchParams,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Beam search over one tokenized prompt on the engine, as upstream and
        as `LLM.beam_search`: each step, every live beam is generated for one
        token with its top 2 * beam_width logprobs (all beams at once); a
        candidate ending in EOS (unless ignore_eos) is finished, the best
        beam_width others live on. Yields one finished RequestOutput with the
        best beam_width sequences, best first (cumulative logprob / length **
        length_penalty). Cancelling it cancels (aborts) the step in flight."""
        max_logprobs = self.model_config.max_logprobs
        if max_logprobs != -1 and 2 * params.beam_width > max_logprobs:
            raise VLLMValidationError(
                f"Beam search with n={params.beam_width} needs the top "
                f"{2 * params.beam_width} logprobs of each step, more than this server "
                f"allows (--max-logprobs {max_logprobs}).",
                parameter="n",
            )
        tokenizer = await self.engine_client.get_tokenizer()
        eos = tokenizer.eos_token_id
        prompt_ids = list(prompt["prompt_token_ids"])
        sort_key = create_sort_beams_key_function(eos, params.length_penalty)
        step_params = SamplingParams(
            logprobs=2 * params.beam_width, max_tokens=1, temperature=params.temperature
        )
        instance = BeamSearchInstance.from_prompt(prompt_ids)
        for step in range(params.max_tokens):
            if not instance.beams:
                break
            results = await asyncio.gather(
                *(
                    _final_output(
                        self.engine_client.generate(
                            TokensPrompt(prompt_token_ids=beam.tokens),
                            step_params,
                            f"{request_id}-beam{step}-{i}",
                            lora_request=lora_request,
                            priority=priority,
                        )
                    )
                    for i, beam in enumerate(instance.beams)
                )
            )
            _extend_beams(instance, results, params, sort_key, eos)
        best = sorted(instance.completed + instance.beams, key=sort_key, reverse=True)[
            : params.beam_width
        ]
        outputs = []
        for i, beam in enumerate(best):
            generated = beam.tokens[len(prompt_ids) :]
            finished_by_eos = beam.finish_reason == "stop"
            text_ids = generated[:-1] if finished_by_eos else generated
            token_ids = (
                generated
                if (params.include_stop_str_in_output or not finished_by_eos)
                else text_ids
            )
            outputs.append(
                CompletionOutput(
                    index=i,
                    text=tokenizer.decode(text_ids),
                    token_ids=token_ids,
                    cumulative_logprob=beam.cum_logprob,
                    logprobs=None,
                    finish_reason=beam.finish_reason or "length",
                    stop_reason=beam.stop_reason,
                )
            )
        yield RequestOutput(
            request_id=request_id,
            prompt=prompt.get("prompt"),
            prompt_token_ids=prompt_ids,
            prompt_logprobs=None,
            outputs=outputs,
            finished=True,
        )


async def _final_output(generator: AsyncIterator[T]) -> T:
    """The last item of a generator (closing it, so that a cancel aborts it)."""
    last = None
    try:
        async for item in generator:
            last = item
    finally:
        await generator.aclose()  # type: ignore[attr-defined]
    assert last is not None, "the engine yields until a request is finished"
    return last


def _extend_beams(
    instance: BeamSearchInstance,
    results: list[RequestOutput],
    params: BeamSearchParams,
    sort_key: Callable[[BeamSearchSequence], float],
    eos: int | None,
) -> None:
    """One beam search step: every live beam times its candidate tokens; EOS
    candidates finish (kept with the EOS, which the score does not count)."""
    candidates: list[BeamSearchSequence] = []
    for beam, result in zip(instance.beams, results):
        output = result.outputs[0]
        if output.finish_reason == "error":
            raise GenerationError()
        if not output.logprobs:  # finished without a token (aborted)
            continue
        for token_id, logprob in output.logprobs[0].items():
            new_beam = BeamSearchSequence(
                tokens=beam.tokens + [token_id],
                logprobs=beam.logprobs + [output.logprobs[0]],
                cum_logprob=beam.cum_logprob + logprob.logprob,
            )
            if token_id == eos and not params.ignore_eos:
                new_beam.finish_reason, new_beam.stop_reason = "stop", eos
                instance.completed.append(new_beam)
            else:
                candidates.append(new_beam)
    candidates.sort(key=sort_key, reverse=True)
    instance.beams = candidates[: params.beam_width]


# ----------------------------------------------------------------------
# Logprob formatting
# ----------------------------------------------------------------------


def clamp_logprob(value: float) -> float:
    """JSON has no -inf (and NaN means nothing): floor at -9999."""
    return value if value >= LOGPROB_FLOOR else LOGPROB_FLOOR


def decoded_token(
    token_id: int, logprob: Logprob, tokenizer: TokenizerLike, return_as_token_id: bool = False
) -> str:
    if return_as_token_id:
        return f"token_id:{token_id}"
    if logprob.decoded_token is not None:
        return logprob.decoded_token
    return tokenizer.decode([token_id])


def ranked(position: dict[int, Logprob]) -> list[tuple[int, Logprob]]:
    """A position's (token id, Logprob), most likely first."""
    return sorted(position.items(), key=lambda kv: (kv[1].rank is None, kv[1].rank or 0))


async def merge_async_iterators(
    *iterators: AsyncGenerator[T, None],
) -> AsyncGenerator[tuple[int, T], None]:
    """Yield (index of the source, item) as items arrive from any iterator.

    Closing the merged iterator closes (and so aborts) every source.
    """
    if len(iterators) == 1:
        try:
            async for item in iterators[0]:
                yield 0, item
        finally:
            await iterators[0].aclose()
        return
    loop = asyncio.get_running_loop()
    awaits = {loop.create_task(anext(it)): (i, it) for i, it in enumerate(iterators)}
    try:
        while awaits:
            done, _ = await asyncio.wait(awaits.keys(), return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                pair = awaits.pop(task)
                try:
                    item = await task
                except StopAsyncIteration:
                    continue
                yield pair[0], item
                awaits[loop.create_task(anext(pair[1]))] = pair
    finally:
        # Cancelling a pending anext() aborts its request; then close the rest.
        for task in awaits:
            task.cancel()
        await asyncio.gather(*awaits, return_exceptions=True)
        for it in iterators:
            await it.aclose()


async def prime(iterator: AsyncGenerator[T, None]) -> AsyncGenerator[T, None]:
    """Wait for the first item now, so that errors raised before any output
    (bad input, a full queue) surface as an HTTP error rather than inside a
    stream that already answered 200. Returns an iterator over all items."""
    first = await anext(iterator)

    async def chained() -> AsyncGenerator[T, None]:
        try:
            yield first
            async for item in iterator:
                yield item
        finally:
            await iterator.aclose()

    return chained()
