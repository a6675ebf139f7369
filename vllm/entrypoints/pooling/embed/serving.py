"""`/v1/embeddings` handler (upstream: vllm/entrypoints/pooling/embed/serving.py
OpenAIServingEmbedding).

Each input is tokenized (or taken as token ids), checked against the
context, sent to the engine as one pooling request with task "embed", and
the finished vectors are returned in input order. Truncation as upstream: a
text through the tokenizer's own truncation (its side, special tokens kept),
token ids keep their last `truncate_prompt_tokens`.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING, Any

from fastapi import Request

from vllm.entrypoints.openai.protocol_base import ErrorResponse, UsageInfo
from vllm.entrypoints.openai.request_limits import check_prompt_text_length
from vllm.entrypoints.openai.serving_engine import OpenAIServing, merge_async_iterators
from vllm.entrypoints.pooling.embed.protocol import (
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingResponseData,
)
from vllm.exceptions import VLLMValidationError
from vllm.inputs import TokensPrompt
from vllm.outputs import EmbeddingOutput, PoolingRequestOutput
from vllm.pooling_params import PoolingParams
from vllm.utils import random_uuid

if TYPE_CHECKING:
    from vllm.tokenizers import TokenizerLike


def encode_base64(values: list[float]) -> str:
    """Little-endian float32 bytes (4 a value, in order), base64 encoded."""
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode("ascii")


class OpenAIServingEmbedding(OpenAIServing):
    """Embeddings of texts or token ids (task "embed")."""

    async def create_embedding(
        self, request: EmbeddingRequest, raw_request: Request | None = None
    ) -> EmbeddingResponse | ErrorResponse:
        error = await self._check_model(request)
        if error is not None:
            return error
        request_id = self._base_request_id(raw_request, f"embd-{random_uuid()}")
        try:
            params = self._pooling_params(request)
            tokenizer = await self.engine_client.get_tokenizer()
            prompts = self._tokenize_inputs(request, tokenizer)
            self._check_capacity(len(prompts))
            generators = [
                self._encode(ids, params, f"{request_id}-{i}", request.priority)
                for i, ids in enumerate(prompts)
            ]
            results: list[PoolingRequestOutput[Any] | None] = [None] * len(prompts)
            async for i, res in merge_async_iterators(*generators):
                results[i] = res
        except Exception as e:
            return self.error_from_exception(e)
        return self._response(request, [r for r in results if r is not None])

    def _pooling_params(self, request: EmbeddingRequest) -> PoolingParams:
        params = PoolingParams(dimensions=request.dimensions, normalize=request.normalize)
        params.verify("embed", self.model_config)
        return params

    def _encode(
        self, ids: list[int], params: PoolingParams, request_id: str, priority: int
    ) -> AsyncGenerator[PoolingRequestOutput[Any], None]:
        return self.engine_client.encode(
            TokensPrompt(prompt_token_ids=ids), params.clone(), request_id, priority=priority
        )

    def _tokenize_inputs(
        self, request: EmbeddingRequest, tokenizer: TokenizerLike
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
        request: EmbeddingRequest,
        tokenizer: TokenizerLike,
        keep: int | None,
    ) -> list[int]:
        if isinstance(item, str):
            if keep is None:  # refused before tokenizing when provably too long
                check_prompt_text_length(tokenizer, item, self.max_model_len + 1, None, "input")
                ids = tokenizer.encode(item, add_special_tokens=request.add_special_tokens)
            else:
                ids = tokenizer.encode(
                    item,
                    add_special_tokens=request.add_special_tokens,
                    truncation=True,
                    max_length=keep,
                )
            ids = list(ids)
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
                f"However, you requested {len(ids)} tokens in the input for embedding "
                "generation. Please reduce the length of the input.",
                parameter="input",
            )
        return ids

    def _response(
        self, request: EmbeddingRequest, results: list[PoolingRequestOutput[Any]]
    ) -> EmbeddingResponse:
        data = []
        num_prompt_tokens = 0
        for index, res in enumerate(results):
            values = EmbeddingOutput.from_base(res.outputs).embedding
            embedding: list[float] | str = (
                encode_base64(values) if request.encoding_format == "base64" else values
            )
            data.append(EmbeddingResponseData(index=index, embedding=embedding))
            num_prompt_tokens += len(res.prompt_token_ids)
        return EmbeddingResponse(
            model=self._get_model_name(request.model),
            data=data,
            usage=UsageInfo(prompt_tokens=num_prompt_tokens, total_tokens=num_prompt_tokens),
        )
