"""Shared handling of the pooling routes (upstream:
vllm/entrypoints/pooling/base/serving.py).

Each input (a text, token ids, or a conversation rendered with the chat
template) becomes one prompt's token ids, checked against the context and
sent to the engine as one pooling request; the finished outputs come back in
input order.

Truncation and length checks as upstream v0.28's TokenizeParams:
`truncate_prompt_tokens` k keeps k tokens (-1: max_model_len), taken from
`truncation_side` ("right" keeps the first, "left" the last; unset: the
tokenizer's own side, through its truncation for a text, special tokens
kept). Untruncated, a text is tokenized to at most max_model_len + 1 tokens
(bounded work) and a prompt over max_model_len is a 400 naming its length.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import Request
from fastapi.responses import Response

from vllm.entrypoints.chat_utils import apply_hf_chat_template
from vllm.entrypoints.openai.protocol_base import ErrorResponse, OpenAIBaseModel
from vllm.entrypoints.openai.request_limits import check_prompt_text_length
from vllm.entrypoints.openai.serving_engine import OpenAIServing, merge_async_iterators
from vllm.entrypoints.pooling.base.protocol import (
    ChatRequestOptionsMixin,
    CompletionRequestMixin,
    EncodingRequestMixin,
    PoolingBasicRequestMixin,
)
from vllm.entrypoints.pooling.utils import (
    JsonEncodedPoolingOutput,
    build_pooling_bytes_response,
    encode_pooling_output,
    get_pooling_usage,
)
from vllm.exceptions import VLLMValidationError
from vllm.inputs import TokensPrompt
from vllm.outputs import PoolingRequestOutput
from vllm.pooling_params import PoolingParams

if TYPE_CHECKING:
    from vllm.engine.protocol import EngineClient
    from vllm.entrypoints.openai.serving_models import OpenAIServingModels
    from vllm.lora.request import LoRARequest
    from vllm.tokenizers import TokenizerLike

ResponseT = TypeVar("ResponseT", bound=OpenAIBaseModel)


class PoolingServingBase(OpenAIServing):
    """Render a pooling request's inputs and run them (one task)."""

    def __init__(
        self,
        engine_client: EngineClient,
        models: OpenAIServingModels,
        *,
        chat_template: str | None = None,
        trust_request_chat_template: bool = False,
    ) -> None:
        super().__init__(engine_client, models)
        self.chat_template = chat_template
        self.trust_request_chat_template = trust_request_chat_template
        encoder_config = getattr(self.model_config, "encoder_config", None) or {}
        self.do_lower_case = bool(encoder_config.get("do_lower_case", False))

    async def run_pooling(
        self,
        request: PoolingBasicRequestMixin,
        params: PoolingParams,
        request_id: str,
        lora_request: LoRARequest | None = None,
    ) -> list[PoolingRequestOutput[Any]]:
        """Every input of the request as one engine request."""
        tokenizer = await self.engine_client.get_tokenizer()
        prompts = [
            TokensPrompt(prompt_token_ids=ids) for ids in self._prompt_token_ids(request, tokenizer)
        ]
        return await self.encode_prompts(
            prompts, [params] * len(prompts), request_id, request.priority, lora_request
        )

    async def encode_prompts(
        self,
        prompts: Sequence[TokensPrompt],
        params: Sequence[PoolingParams],
        request_id: str,
        priority: int,
        lora_request: LoRARequest | None,
    ) -> list[PoolingRequestOutput[Any]]:
        """Run prompt i with params[i] (a copy) as engine request
        `{request_id}-{i}` under `lora_request` (the adapter `request.model`
        names, resolved by the handler right after `_check_model`; None: the
        base model); the outputs in prompt order."""
        self._check_capacity(len(prompts))
        generators = [
            self.engine_client.encode(
                prompt,
                prompt_params.clone(),
                f"{request_id}-{i}",
                lora_request=lora_request,
                priority=priority,
            )
            for i, (prompt, prompt_params) in enumerate(zip(prompts, params))
        ]
        results: list[PoolingRequestOutput[Any] | None] = [None] * len(prompts)
        async for i, res in merge_async_iterators(*generators):
            results[i] = res
        return [r for r in results if r is not None]

    async def create_encoded(
        self,
        request: PoolingBasicRequestMixin,
        raw_request: Request | None,
        prefix: str,
        make_params: Callable[[], PoolingParams],
        make_item: Callable[[int, JsonEncodedPoolingOutput], OpenAIBaseModel],
        response_type: Callable[..., ResponseT],
    ) -> ResponseT | Response | ErrorResponse:
        """The /v1/embeddings and /pooling flow: run the request (params from
        `make_params`; its errors become the error body) and write one output
        per input as `encoding_format` says: a binary body for bytes /
        bytes_only, else `response_type` whose `data` is `make_item(index,
        floats or base64)` per input."""
        assert isinstance(request, EncodingRequestMixin)
        error = await self._check_model(request)
        if error is not None:
            return error
        lora_request = self._maybe_get_adapters(request)
        request_id = self.request_id(raw_request, prefix)
        created = int(time.time())
        try:
            results = await self.run_pooling(request, make_params(), request_id, lora_request)
        except Exception as e:
            return self.error_from_exception(e)
        model_name = self._get_model_name(request.model)
        fmt, dtype, endianness = request.encoding_format, request.embed_dtype, request.endianness
        if fmt in ("bytes", "bytes_only"):
            return build_pooling_bytes_response(
                results, request_id, created, model_name, fmt, dtype, endianness
            )
        assert fmt in ("float", "base64")
        data = [
            make_item(i, encode_pooling_output(res.outputs.data, fmt, dtype, endianness))
            for i, res in enumerate(results)
        ]
        return response_type(
            id=request_id,
            created=created,
            model=model_name,
            data=data,
            usage=get_pooling_usage(results),
        )

    def request_id(self, raw_request: Request | None, prefix: str) -> str:
        from vllm.utils import random_uuid

        return f"{prefix}-{self._base_request_id(raw_request, random_uuid())}"

    # ------------------------------------------------------------------
    # Inputs -> token ids
    # ------------------------------------------------------------------

    def _prompt_token_ids(
        self, request: PoolingBasicRequestMixin, tokenizer: TokenizerLike
    ) -> list[list[int]]:
        keep = self._truncation_length(request.truncate_prompt_tokens)
        items: Sequence[str | list[int]]
        if isinstance(request, ChatRequestOptionsMixin):
            items = [self._render_chat(c, request, tokenizer) for c in self._conversations(request)]
            add_special_tokens = request.add_special_tokens
        else:
            assert isinstance(request, CompletionRequestMixin)
            items = self._completion_items(request.input)
            add_special_tokens = request.add_special_tokens
        if not items:
            raise VLLMValidationError("You must pass at least one prompt", parameter="input")
        return [
            self._check_length(self._tokens(item, request, tokenizer, add_special_tokens, keep))
            for item in items
        ]

    @staticmethod
    def _completion_items(raw: Any) -> Sequence[str | list[int]]:
        if isinstance(raw, str):
            return [raw]
        if raw and isinstance(raw[0], int):
            return [raw]
        return raw

    @staticmethod
    def _conversations(request: Any) -> list[list[dict[str, Any]]]:
        """The request's conversation(s) as plain dicts (a batched chat
        request holds a list of conversations)."""
        messages = request.messages
        batched = bool(messages) and isinstance(messages[0], list)
        conversations = messages if batched else [messages]
        return [[m.model_dump(exclude_none=True) for m in conv] for conv in conversations]

    def _render_chat(
        self,
        conversation: list[dict[str, Any]],
        request: ChatRequestOptionsMixin,
        tokenizer: TokenizerLike,
    ) -> str:
        kwargs = request.chat_template_kwargs or {}
        if not self.trust_request_chat_template and (
            request.chat_template is not None or kwargs.get("chat_template") is not None
        ):
            raise VLLMValidationError(
                "Chat template is passed with request, but --trust-request-chat-template is "
                "not set. Refused request with untrusted chat template.",
                parameter="chat_template",
            )
        return apply_hf_chat_template(
            tokenizer,
            conversation,
            request.chat_template or self.chat_template,
            None,
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
            chat_template_kwargs=request.chat_template_kwargs,
        )

    def _truncation_length(self, truncate_prompt_tokens: int | None) -> int | None:
        if truncate_prompt_tokens is None:
            return None
        if truncate_prompt_tokens == -1:
            return self.max_model_len
        if truncate_prompt_tokens > self.max_model_len:
            # Upstream checks this before tokenizing (PoolingServing._validate_request).
            raise VLLMValidationError(
                "truncate_prompt_tokens value is greater than max_model_len. "
                "Please request a smaller truncation size.",
                parameter="truncate_prompt_tokens",
                value=truncate_prompt_tokens,
            )
        return truncate_prompt_tokens

    def _tokens(
        self,
        item: str | list[int],
        request: PoolingBasicRequestMixin,
        tokenizer: TokenizerLike,
        add_special_tokens: bool,
        keep: int | None,
    ) -> list[int]:
        side = request.truncation_side
        if isinstance(item, str):
            ids = self._encode_text(item, add_special_tokens, tokenizer, keep, side)
        else:
            vocab_size = self.model_config.get_vocab_size()
            bad = [t for t in item if t >= vocab_size]
            if bad:
                raise VLLMValidationError(
                    f"Token id {bad[0]} is out of vocabulary (vocabulary size {vocab_size})",
                    parameter="input",
                )
            ids = list(item)
        if keep is not None and len(ids) > keep:
            side = side or getattr(tokenizer, "truncation_side", "right")
            ids = ids[len(ids) - keep :] if side == "left" else ids[:keep]
        if not ids:
            raise VLLMValidationError("Prompt cannot be empty.", parameter="input")
        return ids

    def _encode_text(
        self,
        text: str,
        add_special_tokens: bool,
        tokenizer: TokenizerLike,
        keep: int | None,
        side: str | None = None,
    ) -> list[int]:
        if self.do_lower_case:
            text = text.lower()
        if keep is None:
            # Refused before tokenizing when provably too long; else at most
            # max_model_len + 1 tokens are made (enough to refuse it).
            check_prompt_text_length(tokenizer, text, self.max_model_len, 0, "input")
            limit = self.max_model_len + 1
        elif side is None:
            limit = keep  # the tokenizer's truncation, on its own side
        else:
            limit = None  # all of it, sliced on the requested side
        if limit is None:
            return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
        return list(
            tokenizer.encode(
                text, add_special_tokens=add_special_tokens, truncation=True, max_length=limit
            )
        )

    def _check_length(self, ids: list[int]) -> list[int]:
        if len(ids) > self.max_model_len:
            # A text is tokenized to at most max_model_len + 1 tokens.
            qualifier = "at least " if len(ids) == self.max_model_len + 1 else ""
            raise VLLMValidationError(
                f"This model's maximum context length is {self.max_model_len} tokens. "
                f"However, you requested 0 output tokens and your prompt contains "
                f"{qualifier}{len(ids)} input tokens, for a total of {qualifier}{len(ids)} "
                "tokens. Please reduce the length of the input prompt or the number of "
                "requested output tokens.",
                parameter="input_tokens",
                value=len(ids),
            )
        return ids
