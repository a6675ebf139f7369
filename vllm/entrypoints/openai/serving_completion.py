"""`/v1/completions` (upstream: vllm/entrypoints/openai/serving_completion.py).

One engine request per prompt (a request may carry several); their outputs
are merged. Choice `i * n + j` is completion j of prompt i. Streaming sends
`data: {chunk}` frames and ends with `data: [DONE]`, also after an error.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from vllm.entrypoints.openai.protocol import (
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
    ErrorResponse,
)
from vllm.entrypoints.openai.request_limits import check_prompt_text_length
from vllm.entrypoints.openai.serving_engine import (
    GenerationError,
    OpenAIServing,
    clamp_logprob,
    decoded_token,
    merge_async_iterators,
    prime,
)
from vllm.exceptions import VLLMValidationError
from vllm.inputs import TokensPrompt
from vllm.logger import init_logger
from vllm.logprobs import Logprob
from vllm.outputs import RequestOutput

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest
    from vllm.tokenizers import TokenizerLike

logger = init_logger(__name__)

PromptInput = tuple[list[int], str | None]


class OpenAIServingCompletion(OpenAIServing):
    """Handles `/v1/completions`."""

    async def create_completion(
        self, request: CompletionRequest, raw_request: Request | None = None
    ) -> AsyncGenerator[str, None] | CompletionResponse | ErrorResponse:
        """Serve one completion request: a response, an SSE stream, or an error body."""
        error = await self._check_model(request)
        if error is not None:
            return error
        lora_request = self._maybe_get_adapters(request)
        if self.engine_client.errored:
            raise self.engine_client.dead_error
        request_id = f"cmpl-{self._base_request_id(raw_request, request.request_id)}"
        model_name = self._get_model_name(request.model)
        created_time = int(time.time())
        trace_headers = await self._get_trace_headers(raw_request)
        try:
            tokenizer = await self.engine_client.get_tokenizer()
            prompts = self._tokenize_prompts(request, tokenizer)
            self._check_capacity(request.n * len(prompts))
            generators = [
                self._generate(request, ids, text, f"{request_id}-{i}", lora_request, trace_headers)
                for i, (ids, text) in enumerate(prompts)
            ]
        except Exception as e:
            return self.error_from_exception(e)
        try:
            result_generator = await prime(merge_async_iterators(*generators))
        except Exception as e:
            if isinstance(e, type(self.engine_client.dead_error)):
                raise
            return self.error_from_exception(e, request)
        if request.stream:
            return self.completion_stream_generator(
                request,
                result_generator,
                request_id,
                created_time,
                model_name,
                len(prompts),
                tokenizer,
            )
        final_res_batch: list[RequestOutput | None] = [None] * len(prompts)
        try:
            async for i, res in result_generator:
                final_res_batch[i] = res
            return self.request_output_to_completion_response(
                final_res_batch, request, request_id, created_time, model_name, tokenizer
            )
        except Exception as e:
            if isinstance(e, type(self.engine_client.dead_error)):
                raise
            return self.error_from_exception(e)

    # ------------------------------------------------------------------
    # Prompts
    # ------------------------------------------------------------------

    def _tokenize_prompts(
        self, request: CompletionRequest, tokenizer: TokenizerLike
    ) -> list[PromptInput]:
        prompt = request.prompt
        if isinstance(prompt, str):
            raw: Sequence[str | list[int]] = [prompt]
        elif prompt and isinstance(prompt[0], int):
            raw = [prompt]  # type: ignore[list-item]
        else:
            raw = prompt  # type: ignore[assignment]
        vocab_size = self.model_config.get_vocab_size()
        prompts = []
        for item in raw:
            if isinstance(item, str):
                if request.truncate_prompt_tokens is None:  # refused before tokenizing
                    check_prompt_text_length(
                        tokenizer,
                        item,
                        self.max_model_len,
                        None if request.echo and request.max_tokens == 0 else request.max_tokens,
                    )
                ids = list(tokenizer.encode(item, add_special_tokens=request.add_special_tokens))
                text: str | None = item
            else:
                bad = [t for t in item if t >= vocab_size]
                if bad:
                    raise VLLMValidationError(
                        f"Token id {bad[0]} is out of vocabulary (vocabulary size {vocab_size})",
                        parameter="prompt",
                    )
                ids, text = list(item), None
            ids = self._truncate(ids, request.truncate_prompt_tokens, self.max_model_len)
            if not ids:
                raise VLLMValidationError("Prompt cannot be empty.", parameter="prompt")
            if text is None and request.echo:
                text = tokenizer.decode(ids)
            echo_only = request.echo and request.max_tokens == 0
            self._validate_input(ids, None if echo_only else request.max_tokens)
            prompts.append((ids, text))
        return prompts

    def _generate(
        self,
        request: CompletionRequest,
        ids: list[int],
        text: str | None,
        request_id: str,
        lora_request: LoRARequest | None,
        trace_headers: dict[str, str] | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        echo_only = request.echo and request.max_tokens == 0
        # Echo-only still runs one step (the engine always samples a token);
        # the sampled token is dropped from the response.
        max_tokens = 1 if echo_only else self.get_max_tokens(len(ids), request.max_tokens)
        if request.use_beam_search:
            return self._beam_search(request, ids, text, request_id, max_tokens, lora_request)
        self._check_logprobs(request.logprobs, request.prompt_logprobs)
        prompt_logprobs = request.prompt_logprobs
        if request.echo and request.logprobs is not None and prompt_logprobs is None:
            prompt_logprobs = request.logprobs
        params = self.build_sampling_params(request, max_tokens, request.logprobs, prompt_logprobs)
        prompt = TokensPrompt(prompt_token_ids=ids)
        if request.cache_salt is not None:
            prompt["cache_salt"] = request.cache_salt
        return self.engine_client.generate(
            prompt,
            params,
            request_id,
            prompt_text=text,
            lora_request=lora_request,
            trace_headers=trace_headers,
            priority=request.priority,
        )

    def _beam_search(
        self,
        request: CompletionRequest,
        ids: list[int],
        text: str | None,
        request_id: str,
        max_tokens: int,
        lora_request: LoRARequest | None,
    ) -> AsyncGenerator[RequestOutput, None]:
        params = request.to_beam_search_params(max_tokens, self.default_sampling_params)
        prompt = TokensPrompt(prompt_token_ids=ids)
        if text is not None:
            prompt["prompt"] = text
        return self.beam_search(
            prompt, request_id, params, priority=request.priority, lora_request=lora_request
        )

    def _check_logprobs(self, *counts: int | None) -> None:
        max_logprobs = self.model_config.max_logprobs
        for num in counts:
            if num is not None and max_logprobs != -1 and num > max_logprobs:
                raise VLLMValidationError(
                    f"Requested logprobs of {num}, which is greater than max allowed: "
                    f"{max_logprobs}",
                    parameter="logprobs",
                    value=num,
                )

    # ------------------------------------------------------------------
    # Streaming
    # ------------------------------------------------------------------

    async def completion_stream_generator(
        self,
        request: CompletionRequest,
        result_generator: AsyncIterator[tuple[int, RequestOutput]],
        request_id: str,
        created_time: int,
        model_name: str,
        num_prompts: int,
        tokenizer: TokenizerLike,
    ) -> AsyncGenerator[str, None]:
        num_choices = request.n
        previous_text_lens = [0] * num_choices * num_prompts
        previous_num_tokens = [0] * num_choices * num_prompts
        has_echoed = [False] * num_choices * num_prompts
        num_prompt_tokens = [0] * num_prompts
        num_cached_tokens: list[int | None] = [None] * num_prompts
        options = request.stream_options
        include_usage = self.enable_force_include_usage or bool(options and options.include_usage)
        continuous = include_usage and bool(options and options.continuous_usage_stats)
        try:
            async for prompt_idx, res in result_generator:
                num_prompt_tokens[prompt_idx] = len(res.prompt_token_ids or [])
                num_cached_tokens[prompt_idx] = res.num_cached_tokens
                for output in res.outputs:
                    i = output.index + prompt_idx * num_choices
                    if output.finish_reason == "error":
                        raise GenerationError()
                    delta_text, delta_ids, out_logprobs = self._delta(
                        request, res, output, has_echoed, i
                    )
                    if not delta_text and not delta_ids and not output.finish_reason:
                        continue  # nothing new (e.g. a prefill chunk)
                    logprobs = None
                    if request.logprobs is not None:
                        logprobs = create_completion_logprobs(
                            delta_ids,
                            out_logprobs,
                            request.logprobs,
                            tokenizer,
                            initial_text_offset=previous_text_lens[i],
                            as_token_ids=bool(request.return_tokens_as_token_ids),
                        )
                    previous_text_lens[i] += len(delta_text)
                    if not (request.echo and request.max_tokens == 0):
                        previous_num_tokens[i] += len(output.token_ids)
                    chunk = CompletionStreamResponse(
                        id=request_id,
                        created=created_time,
                        model=model_name,
                        choices=[
                            CompletionResponseStreamChoice(
                                index=i,
                                text=delta_text,
                                logprobs=logprobs,
                                finish_reason=output.finish_reason,
                                stop_reason=output.stop_reason,
                                token_ids=delta_ids if request.return_token_ids else None,
                            )
                        ],
                    )
                    if continuous:
                        chunk.usage = self.usage_info(
                            num_prompt_tokens[prompt_idx], previous_num_tokens[i]
                        )
                    yield f"data: {chunk.model_dump_json()}\n\n"
            if include_usage:
                usage = self.usage_info(
                    sum(num_prompt_tokens),
                    sum(previous_num_tokens),
                    _total_cached(num_cached_tokens),
                )
                final = CompletionStreamResponse(
                    id=request_id, created=created_time, model=model_name, choices=[], usage=usage
                )
                yield f"data: {final.model_dump_json(exclude_none=True)}\n\n"
        except Exception as e:
            logger.info("Streaming completion %s failed: %s", request_id, e)
            yield f"data: {self._stream_error(e)}\n\n"
        yield "data: [DONE]\n\n"

    def _stream_error(self, e: Exception) -> str:
        return self.error_from_exception(e).model_dump_json()

    @staticmethod
    def _delta(
        request: CompletionRequest, res: RequestOutput, output: Any, has_echoed: list[bool], i: int
    ) -> tuple[str, list[int], Any]:
        """This step's (text, token ids, logprobs), the prompt first when echoing."""
        if request.echo and not has_echoed[i]:
            has_echoed[i] = True
            prompt_ids = res.prompt_token_ids or []
            prompt_lps = list(res.prompt_logprobs or [None] * len(prompt_ids))
            if request.max_tokens == 0:
                return res.prompt or "", list(prompt_ids), prompt_lps
            logprobs = prompt_lps + list(output.logprobs) if output.logprobs is not None else None
            return (res.prompt or "") + output.text, [*prompt_ids, *output.token_ids], logprobs
        if request.echo and request.max_tokens == 0:
            return "", [], None
        return output.text, list(output.token_ids), output.logprobs

    # ------------------------------------------------------------------
    # Non-streaming
    # ------------------------------------------------------------------

    def request_output_to_completion_response(
        self,
        final_res_batch: list[RequestOutput | None],
        request: CompletionRequest,
        request_id: str,
        created_time: int,
        model_name: str,
        tokenizer: TokenizerLike,
    ) -> CompletionResponse:
        choices: list[CompletionResponseChoice] = []
        num_prompt_tokens = num_generated_tokens = 0
        cached: list[int | None] = []
        for final_res in final_res_batch:
            assert final_res is not None
            for output in final_res.outputs:
                if output.finish_reason == "error":
                    raise GenerationError()
                has_echoed = [False]
                text, token_ids, out_logprobs = self._delta(
                    request, final_res, output, has_echoed, 0
                )
                logprobs = None
                if request.logprobs is not None:
                    logprobs = create_completion_logprobs(
                        token_ids,
                        out_logprobs,
                        request.logprobs,
                        tokenizer,
                        as_token_ids=bool(request.return_tokens_as_token_ids),
                    )
                choices.append(
                    CompletionResponseChoice(
                        index=len(choices),
                        text=text,
                        logprobs=logprobs,
                        finish_reason=output.finish_reason,
                        stop_reason=output.stop_reason,
                        prompt_logprobs=format_prompt_logprobs(
                            final_res.prompt_logprobs, request.prompt_logprobs
                        ),
                        token_ids=list(output.token_ids) if request.return_token_ids else None,
                        prompt_token_ids=(
                            final_res.prompt_token_ids if request.return_token_ids else None
                        ),
                    )
                )
                if not (request.echo and request.max_tokens == 0):
                    num_generated_tokens += len(output.token_ids)
            num_prompt_tokens += len(final_res.prompt_token_ids or [])
            cached.append(final_res.num_cached_tokens)
        return CompletionResponse(
            id=request_id,
            created=created_time,
            model=model_name,
            choices=choices,
            usage=self.usage_info(num_prompt_tokens, num_generated_tokens, _total_cached(cached)),
        )


def _total_cached(per_prompt: list[int | None]) -> int | None:
    """Prefix-cache hits over a request's prompts (None when none was reported)."""
    known = [n for n in per_prompt if n is not None]
    return sum(known) if known else None


def create_completion_logprobs(
    token_ids: list[int],
    top_logprobs: Sequence[dict[int, Logprob] | None] | None,
    num_output_top_logprobs: int,
    tokenizer: TokenizerLike,
    initial_text_offset: int = 0,
    as_token_ids: bool = False,
) -> CompletionLogProbs:
    """The `logprobs` object of a completion choice.

    Each position lists the chosen token and the top `num_output_top_logprobs`
    candidates (so k or k + 1 entries); a position without logprobs (the
    first prompt token when echoing) has None.
    """
    out = CompletionLogProbs()
    last_token_len = 0
    for i, token_id in enumerate(token_ids):
        position = top_logprobs[i] if top_logprobs is not None else None
        if position is None or token_id not in position:
            token = f"token_id:{token_id}" if as_token_ids else tokenizer.decode([token_id])
            out.tokens.append(token)
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
        else:
            step = position[token_id]
            token = decoded_token(token_id, step, tokenizer, as_token_ids)
            out.tokens.append(token)
            out.token_logprobs.append(clamp_logprob(step.logprob))
            out.top_logprobs.append(
                {
                    decoded_token(tid, lp, tokenizer, as_token_ids): clamp_logprob(lp.logprob)
                    for j, (tid, lp) in enumerate(position.items())
                    if j <= num_output_top_logprobs
                }
            )
        out.text_offset.append(
            initial_text_offset if not out.text_offset else out.text_offset[-1] + last_token_len
        )
        last_token_len = len(token)
    return out


def format_prompt_logprobs(
    prompt_logprobs: Any, requested: int | None
) -> list[dict[int, dict[str, Any]] | None] | None:
    """Prompt logprobs for the response (only when the request asked for them)."""
    if requested is None or prompt_logprobs is None:
        return None
    return [
        None
        if position is None
        else {
            tid: {
                "logprob": clamp_logprob(lp.logprob),
                "rank": lp.rank,
                "decoded_token": lp.decoded_token,
            }
            for tid, lp in position.items()
        }
        for position in prompt_logprobs
    ]
