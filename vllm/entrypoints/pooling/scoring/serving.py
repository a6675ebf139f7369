"""`/score` and `/rerank` handler (upstream:
vllm/entrypoints/pooling/scoring/serving.py ServingScores).

A cross-encoder (a one-label classifier, task "classify") runs each
(data_1, data_2) pair as one prompt: the tokenizer's pair encoding, with the
segment boundary in the params for BERT-style token_type_ids. An embedding
model (task "embed") embeds data_1 and data_2 (a single data_1 once) and
scores each pair by cosine similarity. The pairing, truncation and scoring
helpers are LLM.score's (vllm/entrypoints/score_utils.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import Request

from vllm.entrypoints.openai.protocol_base import ErrorResponse, UsageInfo
from vllm.entrypoints.openai.request_limits import check_prompt_text_length
from vllm.entrypoints.pooling.base.serving import PoolingServingBase
from vllm.entrypoints.pooling.scoring.protocol import (
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
    check_token_limit,
    cross_encoder_request,
    score_input_lists,
    score_tokenization_kwargs,
    truncate_score_data,
)
from vllm.inputs import TokensPrompt
from vllm.outputs import ScoringRequestOutput
from vllm.pooling_params import PoolingParams
from vllm.utils import random_uuid

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest
    from vllm.tokenizers import TokenizerLike


class ServingScores(PoolingServingBase):
    """Similarity scores of text pairs (tasks "classify" or "embed")."""

    async def create_score(
        self, request: ScoreRequest, raw_request: Request | None = None
    ) -> ScoreResponse | ErrorResponse:
        """Sentence-transformers CrossEncoder-like scores, one per pair."""
        run = await self._score_request(request, raw_request, request.data_1, request.data_2)
        if isinstance(run, ErrorResponse):
            return run
        request_id, results = run
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
        best `top_n` of them (0: all)."""
        run = await self._score_request(request, raw_request, request.query, request.documents)
        if isinstance(run, ErrorResponse):
            return run
        request_id, results = run
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
        if 0 < request.top_n < len(ranked):  # 0: all
            ranked = ranked[: request.top_n]
        tokens = sum(len(res.prompt_token_ids) for res in results)
        return RerankResponse(
            id=request_id,
            model=self._get_model_name(request.model),
            usage=RerankUsage(prompt_tokens=tokens, total_tokens=tokens),
            results=ranked,
        )

    async def _score_request(
        self,
        request: ScoreRequest | RerankRequest,
        raw_request: Request | None,
        data_1: str | list[str],
        data_2: str | list[str],
    ) -> tuple[str, list[ScoringRequestOutput]] | ErrorResponse:
        """The request id and the pairs' scores, or the error body."""
        error = await self._check_model(request)
        if error is not None:
            return error
        lora_request = self._maybe_get_adapters(request)
        # As upstream v0.28: one "score" prefix for both routes.
        request_id = f"score-{self._base_request_id(raw_request, random_uuid())}"
        try:
            scores = await self._run_scoring(data_1, data_2, request, request_id, lora_request)
            return request_id, scores
        except Exception as e:
            return self.error_from_exception(e)

    async def _run_scoring(
        self,
        data_1: str | list[str],
        data_2: str | list[str],
        request: ScoringRequestMixin,
        request_id: str,
        lora_request: LoRARequest | None,
    ) -> list[ScoringRequestOutput]:
        list_1, list_2 = score_input_lists(data_1, data_2)
        tokenizer = await self.engine_client.get_tokenizer()
        max_query, max_doc = (
            check_token_limit(value, name, self.max_model_len) if value else 0
            for name, value in (
                ("max_tokens_per_query", request.max_tokens_per_query),
                ("max_tokens_per_doc", request.max_tokens_per_doc),
            )
        )
        list_1 = truncate_score_data(list_1, tokenizer, max_query)
        list_2 = truncate_score_data(list_2, tokenizer, max_doc)
        if self.model_config.is_cross_encoder:
            prompts, params_list = self._cross_encoding_prompts(
                list_1, list_2, request, tokenizer, max_doc
            )
        else:
            prompts, params_list = self._embedding_prompts(list_1 + list_2, request, tokenizer)
        outputs = await self.encode_prompts(
            prompts, params_list, request_id, request.priority, lora_request
        )
        if self.model_config.is_cross_encoder:
            return [ScoringRequestOutput.from_base(out) for out in outputs]
        embed_1, embed_2 = outputs[: len(list_1)], outputs[len(list_1) :]
        if len(embed_1) == 1:
            embed_1 = embed_1 * len(embed_2)
        return _cosine_similarity(tokenizer, embed_1, embed_2)

    def _embedding_prompts(
        self, texts: list[str], request: ScoringRequestMixin, tokenizer: TokenizerLike
    ) -> tuple[list[TokensPrompt], list[PoolingParams]]:
        """One embedding prompt per text (data_1's, then data_2's)."""
        params = request.to_pooling_params()
        params.verify("embed", self.model_config)
        keep = self._truncation_length(request.truncate_prompt_tokens)
        prompts = [
            TokensPrompt(
                prompt_token_ids=self._check_length(
                    self._tokens(text, request, tokenizer, True, keep)
                )
            )
            for text in texts
        ]
        return prompts, [params] * len(prompts)

    def _cross_encoding_prompts(
        self,
        list_1: list[str],
        list_2: list[str],
        request: ScoringRequestMixin,
        tokenizer: TokenizerLike,
        max_tokens_per_doc: int,
    ) -> tuple[list[TokensPrompt], list[PoolingParams]]:
        """One prompt per (text_1, text_2) pair, with its own params."""
        check_cross_encoder(self.model_config)
        params = request.to_pooling_params()
        params.verify("classify", self.model_config)
        keep = self._truncation_length(request.truncate_prompt_tokens)
        side = request.truncation_side if keep is not None else None
        tok_kwargs = score_tokenization_kwargs(keep, self.max_model_len, side=side)
        if len(list_1) == 1:
            list_1 = list_1 * len(list_2)
        prompts, params_list = [], []
        for text_1, text_2 in zip(list_1, list_2):
            if keep is None:
                # A pair is at least as long as either text: refuse a
                # provably over-long one before tokenizing it.
                for text in (text_1, text_2):
                    check_prompt_text_length(tokenizer, text, self.max_model_len, 0, "input")
            prompt, pair_params = cross_encoder_request(
                tokenizer,
                text_1,
                text_2,
                params,
                tok_kwargs,
                max_tokens_per_doc=max_tokens_per_doc,
                keep=keep,
                side=side,
            )
            self._check_length(prompt["prompt_token_ids"])
            prompts.append(prompt)
            params_list.append(pair_params)
        return prompts, params_list
