"""`/tokenize` and `/detokenize` (upstream:
vllm/entrypoints/openai/serving_tokenization.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm.entrypoints.chat_utils import apply_hf_chat_template
from vllm.entrypoints.openai.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorResponse,
    TokenizeChatRequest,
    TokenizeRequest,
    TokenizeResponse,
)
from vllm.entrypoints.openai.request_limits import check_prompt_text_length, check_token_count
from vllm.entrypoints.openai.serving_engine import OpenAIServing
from vllm.exceptions import VLLMValidationError

if TYPE_CHECKING:
    from vllm.engine.protocol import EngineClient
    from vllm.entrypoints.openai.serving_models import OpenAIServingModels
    from vllm.tokenizers import TokenizerLike


class OpenAIServingTokenization(OpenAIServing):
    """Tokenize text or a rendered conversation; detokenize ids."""

    def __init__(
        self,
        engine_client: EngineClient,
        models: OpenAIServingModels,
        *,
        chat_template: str | None,
        trust_request_chat_template: bool = False,
    ) -> None:
        super().__init__(engine_client, models)
        self.chat_template = chat_template
        self.trust_request_chat_template = trust_request_chat_template

    async def create_tokenize(self, request: TokenizeRequest) -> TokenizeResponse | ErrorResponse:
        error = await self._check_model(request)
        if error is not None:
            return error
        try:
            tokenizer = await self.engine_client.get_tokenizer()
            if isinstance(request, TokenizeChatRequest):
                text = self._render_chat(request, tokenizer)
            else:
                text = request.prompt
            # At most max_model_len tokens: refused before tokenizing when the
            # text alone proves it longer (bounded work per request).
            check_prompt_text_length(
                tokenizer,
                text,
                self.max_model_len,
                0,
                "messages" if isinstance(request, TokenizeChatRequest) else "prompt",
            )
            ids = list(tokenizer.encode(text, add_special_tokens=request.add_special_tokens))
        except Exception as e:
            return self.error_from_exception(e)
        token_strs = tokenizer.convert_ids_to_tokens(ids) if request.return_token_strs else None
        return TokenizeResponse(
            tokens=ids, token_strs=token_strs, count=len(ids), max_model_len=self.max_model_len
        )

    def _render_chat(self, request: TokenizeChatRequest, tokenizer: TokenizerLike) -> str:
        if request.chat_template is not None and not self.trust_request_chat_template:
            raise VLLMValidationError(
                "Chat template is passed with request, but --trust-request-chat-template is "
                "not set. Refused request with untrusted chat template.",
                parameter="chat_template",
            )
        tools = [t.model_dump() for t in request.tools] if request.tools else None
        return apply_hf_chat_template(
            tokenizer,
            [m.model_dump(exclude_none=True) for m in request.messages],
            request.chat_template or self.chat_template,
            tools,
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
            chat_template_kwargs=request.chat_template_kwargs,
        )

    async def create_detokenize(
        self, request: DetokenizeRequest
    ) -> DetokenizeResponse | ErrorResponse:
        error = await self._check_model(request)
        if error is not None:
            return error
        try:
            check_token_count(len(request.tokens), self.max_model_len, "tokens")
        except ValueError as e:
            return self.error_from_exception(e)
        vocab_size = self.model_config.get_vocab_size()
        bad = [t for t in request.tokens if t >= vocab_size]
        if bad:
            return self.create_error_response(
                f"Token id {bad[0]} is out of vocabulary (vocabulary size {vocab_size})",
                param="tokens",
            )
        tokenizer = await self.engine_client.get_tokenizer()
        return DetokenizeResponse(prompt=tokenizer.decode(request.tokens))
