"""`/score` and `/rerank` handler (upstream:
vllm/entrypoints/pooling/score/serving.py ServingScores).

A cross-encoder (a one-label classifier, task "score") runs each
(data_1, data_2) pair as one prompt: the tokenizer's pair encoding, with the
segment boundary in the params for BERT-style token_type_ids. An embedding
model (task "embed") embeds data_1 and data_2 (a single data_1 once) and
scores each pair by cosine similarity. The pairing, truncation and scoring
helpers are LLM.score's (vllm/entrypoints/score_utils.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import Request

from vllm.entrypoints.openai.protocol_base import ErrorResponse, UsageInfo
from vllm.entrypoints.openai.request_limits import check_prompt_text_length
from vllm.entrypoints.openai.serving_engine import merge_async_iterators
from vllm.entrypoints.pooling.base.serving import PoolingServingBase
from vllm.entrypoints.pooling.score.protocol import (
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    ScoreRequest,
    ScoreResponse,
    ScoreResponseData,
    ScoringRequestMixin,
)
from vllm.entrypoints.score_utils import (
    _cosine_similarity,
    check_cross_encoder,
    cross_encoder_request,
    score_input_lists,
    score_tokenization_kwargs,
)
from vllm.exceptions import VLLMValidationError
from vllm.inputs import TokensPrompt
from vllm.outputs import PoolingRequestOutput, ScoringRequestOutput
from vllm.pooling_params import PoolingParams
from vllm.utils import random_uuid

if TYPE_CHECKING:
    from vllm.tokenizers import TokenizerLike


class ServingScores(PoolingServingBase):
    """Similarity scores of text pairs (tasks "score" or "embed")."""

    what = "score"

    async def create_score(
        self, request: ScoreRequest, raw_request: Request | None = None
    ) -> ScoreResponse | ErrorResponse:
        """Sentence-transformers CrossEncoder-like scores, one per pair."""
        error = await self._check_model(request)
        if error is not None:
            return error
        request_id = f"score-{self._base_request_id(raw_request, random_uuid())}"
        try:
            results = await self._run_scoring(request.data_1, request.data_2, request, request_id)
        except Exception as e:
            return self.error_from_exception(e)
        data = [
            ScoreResponseData(index=i, score=res.outputs.score) for i, res in enumerate(results)
        ]
        tokens = sum(len(res.prompt_token_ids) for res in results)
        return ScoreResponse(
            id=request_id,
            model=self._get_model_name(request.model),
            data=data,
            usage=UsageInfo(prompt_tokens=tokens, total_tokens=tokens),
        )

    async def do_rerank(
        self, request: RerankRequest, raw_request: Request | None = None
    ) -> RerankResponse | ErrorResponse:
        """Jina's rerank API: the documents by relevance to the query, the
        best `top_n` of them (0 or less: all)."""
        error = await self._check_model(request)
        if error is not None:
            return error
        request_id = f"rerank-{self._base_request_id(raw_request, random_uuid())}"
        try:
            results = await self._run_scoring(request.query, request.documents, request, request_id)
        except Exception as e:
            return self.error_from_exception(e)
        documents = [request.documents] if isinstance(request.documents, str) else request.documents
        ranked = [
            RerankResult(
                index=i,
                document=RerankDocument(text=documents[i]),
                relevance_score=res.outputs.score,
            )
            for i, res in enumerate(results)
        ]
        # Stable: equal scores keep the documents' order.
        ranked.sort(key=lambda r: r.relevance_score, reverse=True)
        if 0 < request.top_n < len(ranked):
            ranked = ranked[: request.top_n]
        tokens = sum(len(res.prompt_token_ids) for res in results)
        return RerankResponse(
            id=request_id,
            model=self._get_model_name(request.model),
            usage=RerankUsage(prompt_tokens=tokens, total_tokens=tokens),
            results=ranked,
        )

    async def _run_scoring(
        self,
        data_1: str | list[str],
        data_2: str | list[str],
        request: ScoringRequestMixin,
        request_id: str,
    ) -> list[ScoringRequestOutput]:
        list_1, list_2 = score_input_lists(data_1, data_2)
        tokenizer = await self.engine_client.get_tokenizer()
        if self.model_config.is_cross_encoder:
            return await self._cross_encoding_score(list_1, list_2, request, request_id, tokenizer)
        return await self._embedding_score(list_1, list_2, request, request_id, tokenizer)

    async def _embedding_score(
        self,
        list_1: list[str],
        list_2: list[str],
        request: ScoringRequestMixin,
        request_id: str,
        tokenizer: TokenizerLike,
    ) -> list[ScoringRequestOutput]:
        params = request.to_pooling_params()
        params.verify("embed", self.model_config)
        keep = self._truncation_length(request.truncate_prompt_tokens)
        prompts = []
        for text in list_1 + list_2:
            ids = self._encode_text(text, True, tokenizer, keep)
            self._check_prompt_length(ids)
            prompts.append(TokensPrompt(prompt_token_ids=ids))
        outputs = await self._encode_all(prompts, [params] * len(prompts), request, request_id)
        embed_1, embed_2 = outputs[: len(list_1)], outputs[len(list_1) :]
        if len(embed_1) == 1:
            embed_1 = embed_1 * len(embed_2)
        return _cosine_similarity(tokenizer, embed_1, embed_2)

    async def _cross_encoding_score(
        self,
        list_1: list[str],
        list_2: list[str],
        request: ScoringRequestMixin,
        request_id: str,
        tokenizer: TokenizerLike,
    ) -> list[ScoringRequestOutput]:
        check_cross_encoder(self.model_config)
        params = request.to_pooling_params()
        params.verify("score", self.model_config)
        tok_kwargs = score_tokenization_kwargs(request.truncate_prompt_tokens, self.max_model_len)
        if len(list_1) == 1:
            list_1 = list_1 * len(list_2)
        prompts, params_list = [], []
        for text_1, text_2 in zip(list_1, list_2):
            if "truncation" not in tok_kwargs:
                # A pair is at least as long as either text: refuse a
                # provably over-long one before tokenizing it.
                for text in (text_1, text_2):
                    check_prompt_text_length(tokenizer, text, self.max_model_len + 1, None, "input")
            prompt, pair_params = cross_encoder_request(
                tokenizer, text_1, text_2, params, tok_kwargs
            )
            self._check_prompt_length(prompt["prompt_token_ids"])
            prompts.append(prompt)
            params_list.append(pair_params)
        outputs = await self._encode_all(prompts, params_list, request, request_id)
        return [ScoringRequestOutput.from_base(out) for out in outputs]

    def _check_prompt_length(self, ids: list[int]) -> None:
        if not ids:
            raise VLLMValidationError("Prompt cannot be empty.", parameter="input")
        if len(ids) > self.max_model_len:
            raise VLLMValidationError(
                f"This model's maximum context length is {self.max_model_len} tokens. "
                f"However, you requested {len(ids)} tokens in the input for {self.what}. "
                "Please reduce the length of the input.",
                parameter="input",
            )

    async def _encode_all(
        self,
        prompts: list[TokensPrompt],
        params_list: list[PoolingParams],
        request: ScoringRequestMixin,
        request_id: str,
    ) -> list[PoolingRequestOutput[Any]]:
        """Run every prompt as one engine request; outputs in prompt order."""
        self._check_capacity(len(prompts))
        generators = [
            self.engine_client.encode(
                prompt, params.clone(), f"{request_id}-{i}", priority=request.priority
            )
            for i, (prompt, params) in enumerate(zip(prompts, params_list))
        ]
        results: list[PoolingRequestOutput[Any] | None] = [None] * len(prompts)
        async for i, res in merge_async_iterators(*generators):
            results[i] = res
        return [res for res in results if res is not None]
