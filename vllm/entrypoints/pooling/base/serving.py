"""Shared handling of the pooling routes (upstream:
vllm/entrypoints/pooling/base/serving.py).

Each input is tokenized (or taken as token ids), checked against the
context, and sent to the engine as one pooling request; the finished outputs
come back in input order. Truncation as upstream: a text through the
tokenizer's own truncation (its side, special tokens kept), token ids keep
their last `truncate_prompt_tokens`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fastapi import Request

from vllm.entrypoints.openai.request_limits import check_prompt_text_length
from vllm.entrypoints.openai.serving_engine import OpenAIServing, merge_async_iterators
from vllm.entrypoints.pooling.base.protocol import PoolingBasicRequestMixin
from vllm.exceptions import VLLMValidationError
from vllm.inputs import TokensPrompt
from vllm.outputs import PoolingRequestOutput
from vllm.pooling_params import PoolingParams

if TYPE_CHECKING:
    from vllm.tokenizers import TokenizerLike


class PoolingServingBase(OpenAIServing):
    """Tokenize a pooling request's inputs and run them (one task)."""

    # Named in the over-length message ("... in the input for <what>").
    what: str = "pooling"

    async def run_pooling(
        self,
        request: PoolingBasicRequestMixin,
        params: PoolingParams,
        request_id: str,
    ) -> list[PoolingRequestOutput[Any]]:
        tokenizer = await self.engine_client.get_tokenizer()
        prompts = self._tokenize_inputs(request, tokenizer)
        self._check_capacity(len(prompts))
        generators = [
            self.engine_client.encode(
                TokensPrompt(prompt_token_ids=ids),
                params.clone(),
                f"{request_id}-{i}",
                priority=request.priority,
            )
            for i, ids in enumerate(prompts)
        ]
        results: list[PoolingRequestOutput[Any] | None] = [None] * len(prompts)
        async for i, res in merge_async_iterators(*generators):
            results[i] = res
        return [r for r in results if r is not None]

    def request_id(self, raw_request: Request | None, prefix: str) -> str:
        from vllm.utils import random_uuid

        return self._base_request_id(raw_request, f"{prefix}-{random_uuid()}")

    def _tokenize_inputs(
        self, request: PoolingBasicRequestMixin, tokenizer: TokenizerLike
    ) -> list[list[int]]:
        raw = request.input
        items: Sequence[str | list[int]]
        if isinstance(raw, str):
            items = [raw]
        elif raw and isinstance(raw[0], int):
            items = [raw]  # type: ignore[list-item]
        else:
            items = raw  # type: ignore[assignment]
        if not items:
            raise VLLMValidationError("Input cannot be empty.", parameter="input")
        keep = self._truncation_length(request.truncate_prompt_tokens)
        return [self._prompt_ids(item, request, tokenizer, keep) for item in items]

    def _truncation_length(self, truncate_prompt_tokens: int | None) -> int | None:
        if truncate_prompt_tokens is None:
            return None
        if truncate_prompt_tokens == -1:
            return self.max_model_len
        if truncate_prompt_tokens > self.max_model_len:
            raise VLLMValidationError(
                f"truncate_prompt_tokens value ({truncate_prompt_tokens}) is greater than "
                f"max_model_len ({self.max_model_len}). Please, select a smaller truncation size.",
                parameter="truncate_prompt_tokens",
            )
        return truncate_prompt_tokens

    def _prompt_ids(
        self,
        item: str | list[int],
        request: PoolingBasicRequestMixin,
        tokenizer: TokenizerLike,
        keep: int | None,
    ) -> list[int]:
        if isinstance(item, str):
            ids = self._encode_text(item, request.add_special_tokens, tokenizer, keep)
        else:
            vocab_size = self.model_config.get_vocab_size()
            bad = [t for t in item if t >= vocab_size]
            if bad:
                raise VLLMValidationError(
                    f"Token id {bad[0]} is out of vocabulary (vocabulary size {vocab_size})",
                    parameter="input",
                )
            ids = list(item) if keep is None else (list(item[-keep:]) if keep else [])
        if not ids:
            raise VLLMValidationError("Prompt cannot be empty.", parameter="input")
        if len(ids) > self.max_model_len:
            raise VLLMValidationError(
                f"This model's maximum context length is {self.max_model_len} tokens. "
                f"However, you requested {len(ids)} tokens in the input for {self.what}. "
                "Please reduce the length of the input.",
                parameter="input",
            )
        return ids

    def _encode_text(
        self, text: str, add_special_tokens: bool, tokenizer: TokenizerLike, keep: int | None
    ) -> list[int]:
        if keep is None:
            # Refused before tokenizing when provably too long (a pooling
            # prompt may fill the whole context: max_model_len + 1 here).
            check_prompt_text_length(tokenizer, text, self.max_model_len + 1, None, "input")
            return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
        return list(
            tokenizer.encode(
                text, add_special_tokens=add_special_tokens, truncation=True, max_length=keep
            )
        )
