"""`/v1/chat/completions` (upstream: vllm/entrypoints/openai/serving_chat.py).

The conversation is rendered with the chat template (the tokenizer's or
`--chat-template`), tokenized, and generated as one request with `n`
choices. Streaming: each choice's first chunk carries `delta.role`, later
ones the new text; the last chunk of a choice has its `finish_reason`; with
`include_usage` one more chunk carries the usage and no choices.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from vllm.entrypoints.chat_utils import apply_hf_chat_template
from vllm.entrypoints.openai import tool_choice
from vllm.entrypoints.openai.chat_parsing import ChatParsers, ChoiceParser, merge_deltas
from vllm.entrypoints.openai.protocol import (
    ChatCompletionLogProb,
    ChatCompletionLogProbs,
    ChatCompletionLogProbsContent,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    DeltaMessage,
    ErrorResponse,
)
from vllm.entrypoints.openai.request_limits import check_prompt_text_length
from vllm.entrypoints.openai.serving_completion import format_prompt_logprobs
from vllm.entrypoints.openai.serving_engine import (
    GenerationError,
    OpenAIServing,
    clamp_logprob,
    decoded_token,
    prime,
    ranked,
)
from vllm.exceptions import VLLMValidationError
from vllm.inputs import TokensPrompt
from vllm.logger import init_logger
from vllm.logprobs import Logprob
from vllm.outputs import RequestOutput
from vllm.sampling_params import StructuredOutputsParams

if TYPE_CHECKING:
    from vllm.engine.protocol import EngineClient
    from vllm.entrypoints.openai.serving_models import OpenAIServingModels
    from vllm.tokenizers import TokenizerLike

logger = init_logger(__name__)


class OpenAIServingChat(OpenAIServing):
    """Handles `/v1/chat/completions`."""

    def __init__(
        self,
        engine_client: EngineClient,
        models: OpenAIServingModels,
        response_role: str = "assistant",
        *,
        chat_template: str | None = None,
        trust_request_chat_template: bool = False,
        enable_auto_tools: bool = False,
        tool_parser: str | None = None,
        exclude_tools_when_tool_choice_none: bool = False,
        reasoning_parser: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(engine_client, models, **kwargs)
        self.response_role = response_role
        self.chat_template = chat_template
        self.trust_request_chat_template = trust_request_chat_template
        self.enable_auto_tools = enable_auto_tools
        self.exclude_tools_when_tool_choice_none = exclude_tools_when_tool_choice_none
        # Unknown names were refused at start-up (cli_args.validate_parser_args).
        self.parsers = ChatParsers(tool_parser, reasoning_parser, enable_auto_tools)

    async def create_chat_completion(
        self, request: ChatCompletionRequest, raw_request: Request | None = None
    ) -> AsyncGenerator[str, None] | ChatCompletionResponse | ErrorResponse:
        """Serve one chat request: a response, an SSE stream, or an error body."""
        error = await self._check_model(request)
        if error is not None:
            return error
        lora_request = self._maybe_get_adapters(request)
        if self.engine_client.errored:
            raise self.engine_client.dead_error
        request_id = f"chatcmpl-{self._base_request_id(raw_request, request.request_id)}"
        model_name = self._get_model_name(request.model)
        try:
            self._check_capacity(request.n)
            tokenizer = await self.engine_client.get_tokenizer()
            tool_choice.check_tool_choice(request, self.enable_auto_tools)
            request = self.parsers.adjust_request(request, tokenizer)
            prompt_text, prompt_ids = self._render(request, tokenizer)
            requested = (
                request.max_completion_tokens
                if request.max_completion_tokens is not None
                else request.max_tokens
            )
            self._validate_input(prompt_ids, requested)
            max_tokens = self.get_max_tokens(len(prompt_ids), requested)
            params: Any = (
                request.to_beam_search_params(max_tokens, self.default_sampling_params)
                if request.use_beam_search
                else self.build_sampling_params(
                    request,
                    max_tokens,
                    self._num_logprobs(request),
                    self._num_prompt_logprobs(request),
                )
            )
        except Exception as e:
            return self.error_from_exception(e)
        prompt = TokensPrompt(prompt_token_ids=prompt_ids)
        if request.cache_salt is not None:
            prompt["cache_salt"] = request.cache_salt
        trace_headers = await self._get_trace_headers(raw_request)
        try:
            result_generator = await prime(
                self.beam_search(
                    prompt,
                    request_id,
                    params,
                    priority=request.priority,
                    lora_request=lora_request,
                )
                if request.use_beam_search
                else self.engine_client.generate(
                    prompt,
                    params,
                    request_id,
                    prompt_text=prompt_text,
                    lora_request=lora_request,
                    trace_headers=trace_headers,
                    priority=request.priority,
                    **self._reasoning_kwargs(request),
                )
            )
        except Exception as e:
            if isinstance(e, type(self.engine_client.dead_error)):
                raise
            return self.error_from_exception(e, request)
        if request.stream:
            return self.chat_completion_stream_generator(
                request, result_generator, request_id, model_name, tokenizer
            )
        try:
            return await self.chat_completion_full_generator(
                request, result_generator, request_id, model_name, tokenizer
            )
        except Exception as e:
            if isinstance(e, type(self.engine_client.dead_error)):
                raise
            return self.error_from_exception(e)

    # ------------------------------------------------------------------
    # Prompt
    # ------------------------------------------------------------------

    def _render(
        self, request: ChatCompletionRequest, tokenizer: TokenizerLike
    ) -> tuple[str, list[int]]:
        if request.chat_template is not None and not self.trust_request_chat_template:
            raise VLLMValidationError(
                "Chat template is passed with request, but --trust-request-chat-template is "
                "not set. Refused request with untrusted chat template.",
                parameter="chat_template",
            )
        # As upstream, the template sees the tools also under tool_choice
        # "none", unless --exclude-tools-when-tool-choice-none.
        tools = [t.model_dump() for t in request.tools] if request.tools else None
        if request.tool_choice == "none" and self.exclude_tools_when_tool_choice_none:
            tools = None
        conversation = [m.model_dump(exclude_none=True) for m in request.messages]
        text = apply_hf_chat_template(
            tokenizer,
            conversation,
            request.chat_template or self.chat_template,
            tools,
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
            chat_template_kwargs=request.chat_template_kwargs,
        )
        if request.truncate_prompt_tokens is None:  # refused before tokenizing
            check_prompt_text_length(
                tokenizer,
                text,
                self.max_model_len,
                request.max_completion_tokens
                if request.max_completion_tokens is not None
                else request.max_tokens,
                "messages",
            )
        ids = list(tokenizer.encode(text, add_special_tokens=request.add_special_tokens))
        ids = self._truncate(ids, request.truncate_prompt_tokens, self.max_model_len)
        if not ids:
            raise VLLMValidationError("The rendered prompt is empty.", parameter="messages")
        return text, ids

    def _reasoning_kwargs(self, request: ChatCompletionRequest) -> dict[str, Any]:
        """With a reasoning parser: the request's chat_template_kwargs for the
        engine's copy of it (`enable_thinking: false` lets a grammar start at
        the first token; see vllm/v1/structured_output/__init__.py)."""
        if self.parsers.reasoning_parser_cls is None or not request.chat_template_kwargs:
            return {}
        return {"reasoning_parser_kwargs": {"chat_template_kwargs": request.chat_template_kwargs}}

    @staticmethod
    def _structured_outputs(request: Any) -> StructuredOutputsParams | None:
        """A "required" or named tool_choice constrains the output to the
        tools' JSON schema (tool_choice.py refuses it with another constraint)."""
        schema = tool_choice.forced_tool_schema(request)
        if schema is not None:
            return StructuredOutputsParams(json=schema)
        return OpenAIServing._structured_outputs(request)

    @staticmethod
    def _where_constrained(request: Any) -> str:
        if tool_choice.is_forced(request):
            return "tools"  # the tools' schema failed to compile
        return OpenAIServing._where_constrained(request)

    def _num_logprobs(self, request: ChatCompletionRequest) -> int | None:
        if not request.logprobs:
            return None
        num = request.top_logprobs or 0
        max_logprobs = self.model_config.max_logprobs
        if max_logprobs != -1 and num > max_logprobs:
            raise VLLMValidationError(
                f"Requested top_logprobs of {num}, which is greater "
                f"than max allowed: {max_logprobs}",
                parameter="top_logprobs",
                value=num,
            )
        return num

    def _num_prompt_logprobs(self, request: ChatCompletionRequest) -> int | None:
        num = request.prompt_logprobs
        max_logprobs = self.model_config.max_logprobs
        if num is not None and max_logprobs != -1 and num > max_logprobs:
            raise VLLMValidationError(
                f"Requested prompt_logprobs of {num}, which is "
                f"greater than max allowed: {max_logprobs}",
                parameter="prompt_logprobs",
                value=num,
            )
        return num

    def get_chat_request_role(self, request: ChatCompletionRequest) -> str:
        if request.add_generation_prompt:
            return self.response_role
        return request.messages[-1].role

    # ------------------------------------------------------------------
    # Streaming
    # ------------------------------------------------------------------

    async def chat_completion_stream_generator(
        self,
        request: ChatCompletionRequest,
        result_generator: AsyncIterator[RequestOutput],
        request_id: str,
        model_name: str,
        tokenizer: TokenizerLike,
    ) -> AsyncGenerator[str, None]:
        created_time = int(time.time())
        num_choices = request.n
        role = self.get_chat_request_role(request)
        sent_role = [False] * num_choices
        parsers: list[ChoiceParser | None] = [None] * num_choices
        num_tokens = [0] * num_choices
        num_prompt_tokens = 0
        num_cached_tokens: int | None = None
        options = request.stream_options
        include_usage = self.enable_force_include_usage or bool(options and options.include_usage)
        continuous = include_usage and bool(options and options.continuous_usage_stats)

        def chunk(choice: ChatCompletionResponseStreamChoice, index: int) -> str:
            response = ChatCompletionStreamResponse(
                id=request_id, created=created_time, model=model_name, choices=[choice]
            )
            if continuous:
                response.usage = self.usage_info(num_prompt_tokens, num_tokens[index])
            return f"data: {response.model_dump_json()}\n\n"

        try:
            async for res in result_generator:
                num_prompt_tokens = len(res.prompt_token_ids or [])
                num_cached_tokens = res.num_cached_tokens
                for output in res.outputs:
                    i = output.index
                    if output.finish_reason == "error":
                        raise GenerationError()
                    if not sent_role[i]:
                        sent_role[i] = True
                        yield chunk(
                            ChatCompletionResponseStreamChoice(
                                index=i, delta=DeltaMessage(role=role, content="")
                            ),
                            i,
                        )
                        echo = self._echo_text(request, role)
                        if echo:
                            yield chunk(
                                ChatCompletionResponseStreamChoice(
                                    index=i, delta=DeltaMessage(content=echo)
                                ),
                                i,
                            )
                    if not output.text and not output.token_ids and not output.finish_reason:
                        continue
                    num_tokens[i] += len(output.token_ids)
                    logprobs = None
                    if request.logprobs:
                        logprobs = create_chat_logprobs(
                            output.token_ids,
                            output.logprobs,
                            request.top_logprobs or 0,
                            tokenizer,
                            bool(request.return_tokens_as_token_ids),
                        )
                    finish_reason = output.finish_reason
                    parser = parsers[i]
                    if parser is None:
                        parser = parsers[i] = self.parsers.for_choice(
                            request, tokenizer, res.prompt_token_ids
                        )
                    delta = parser.stream_delta(output.text, output.token_ids)
                    if finish_reason is not None:
                        last, finish_reason = parser.finish(role, finish_reason)
                        delta = merge_deltas(delta or DeltaMessage(), last)
                    elif delta is None and not (logprobs or request.return_token_ids):
                        continue  # text a parser holds back (a marker may be forming)
                    yield chunk(
                        ChatCompletionResponseStreamChoice(
                            index=i,
                            delta=delta or DeltaMessage(),
                            logprobs=logprobs,
                            finish_reason=finish_reason,
                            stop_reason=output.stop_reason,
                            token_ids=list(output.token_ids) if request.return_token_ids else None,
                        ),
                        i,
                    )
            if include_usage:
                final = ChatCompletionStreamResponse(
                    id=request_id,
                    created=created_time,
                    model=model_name,
                    choices=[],
                    usage=self.usage_info(num_prompt_tokens, sum(num_tokens), num_cached_tokens),
                )
                yield f"data: {final.model_dump_json(exclude_none=True)}\n\n"
        except Exception as e:
            logger.info("Streaming chat completion %s failed: %s", request_id, e)
            yield f"data: {self.error_from_exception(e).model_dump_json()}\n\n"
        yield "data: [DONE]\n\n"

    @staticmethod
    def _echo_text(request: ChatCompletionRequest, role: str) -> str:
        """With `echo`, the last message's text when it has the response's role."""
        last = request.messages[-1]
        if not request.echo or last.role != role or not last.content:
            return ""
        if isinstance(last.content, str):
            return last.content
        return "\n".join(p.get("text", "") for p in last.content if isinstance(p, dict))

    # ------------------------------------------------------------------
    # Non-streaming
    # ------------------------------------------------------------------

    async def chat_completion_full_generator(
        self,
        request: ChatCompletionRequest,
        result_generator: AsyncIterator[RequestOutput],
        request_id: str,
        model_name: str,
        tokenizer: TokenizerLike,
    ) -> ChatCompletionResponse:
        created_time = int(time.time())
        final_res: RequestOutput | None = None
        async for res in result_generator:
            final_res = res
        if final_res is None:
            raise GenerationError("The engine returned no output")
        role = self.get_chat_request_role(request)
        echo = self._echo_text(request, role)
        choices = []
        for output in final_res.outputs:
            if output.finish_reason == "error":
                raise GenerationError()
            logprobs = None
            if request.logprobs:
                logprobs = create_chat_logprobs(
                    output.token_ids,
                    output.logprobs,
                    request.top_logprobs or 0,
                    tokenizer,
                    bool(request.return_tokens_as_token_ids),
                )
            parser = self.parsers.for_choice(request, tokenizer, final_res.prompt_token_ids)
            message, finish_reason = parser.message(role, output.text, echo, output.finish_reason)
            choices.append(
                ChatCompletionResponseChoice(
                    index=output.index,
                    message=message,
                    logprobs=logprobs,
                    finish_reason=finish_reason,
                    stop_reason=output.stop_reason,
                    token_ids=list(output.token_ids) if request.return_token_ids else None,
                )
            )
        choices.sort(key=lambda c: c.index)
        num_prompt_tokens = len(final_res.prompt_token_ids or [])
        usage = self.usage_info(
            num_prompt_tokens,
            sum(len(o.token_ids) for o in final_res.outputs),
            final_res.num_cached_tokens,
        )
        return ChatCompletionResponse(
            id=request_id,
            created=created_time,
            model=model_name,
            choices=choices,
            usage=usage,
            prompt_logprobs=format_prompt_logprobs(
                final_res.prompt_logprobs, request.prompt_logprobs
            ),
            prompt_token_ids=(final_res.prompt_token_ids if request.return_token_ids else None),
        )


def create_chat_logprobs(
    token_ids: Sequence[int],
    top_logprobs: Sequence[dict[int, Logprob] | None] | None,
    num_output_top_logprobs: int,
    tokenizer: TokenizerLike,
    as_token_ids: bool = False,
) -> ChatCompletionLogProbs:
    """One entry per generated token: its logprob and the `top_logprobs` most
    likely tokens at that position."""
    content = []
    for i, token_id in enumerate(token_ids):
        position = top_logprobs[i] if top_logprobs is not None else None
        if position is None or token_id not in position:
            token = f"token_id:{token_id}" if as_token_ids else tokenizer.decode([token_id])
            content.append(
                ChatCompletionLogProbsContent(
                    token=token, bytes=list(token.encode("utf-8", errors="replace"))
                )
            )
            continue
        token = decoded_token(token_id, position[token_id], tokenizer, as_token_ids)
        top = [
            ChatCompletionLogProb(
                token=(t := decoded_token(tid, lp, tokenizer, as_token_ids)),
                logprob=clamp_logprob(lp.logprob),
                bytes=list(t.encode("utf-8", errors="replace")),
            )
            for tid, lp in ranked(position)[:num_output_top_logprobs]
        ]
        content.append(
            ChatCompletionLogProbsContent(
                token=token,
                logprob=clamp_logprob(position[token_id].logprob),
                bytes=list(token.encode("utf-8", errors="replace")),
                top_logprobs=top,
            )
        )
    return ChatCompletionLogProbs(content=content)
