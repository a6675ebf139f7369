"""`/v1/embeddings` handler (upstream: vllm/entrypoints/pooling/embed/serving.py
OpenAIServingEmbedding): task "embed", vectors as floats or base64."""

from __future__ import annotations

import base64
import struct
from typing import Any

from fastapi import Request

from vllm.entrypoints.openai.protocol_base import ErrorResponse, UsageInfo
from vllm.entrypoints.pooling.base.serving import PoolingServingBase
from vllm.entrypoints.pooling.embed.protocol import (
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingResponseData,
)
from vllm.outputs import EmbeddingOutput, PoolingRequestOutput
from vllm.pooling_params import PoolingParams


def encode_base64(values: list[float]) -> str:
    """Little-endian float32 bytes (4 a value, in order), base64 encoded."""
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode("ascii")


class OpenAIServingEmbedding(PoolingServingBase):
    """Embeddings of texts or token ids (task "embed")."""

    what = "embedding generation"

    async def create_embedding(
        self, request: EmbeddingRequest, raw_request: Request | None = None
    ) -> EmbeddingResponse | ErrorResponse:
        error = await self._check_model(request)
        if error is not None:
            return error
        try:
            params = PoolingParams(dimensions=request.dimensions, normalize=request.normalize)
            params.verify("embed", self.model_config)
            results = await self.run_pooling(request, params, self.request_id(raw_request, "embd"))
        except Exception as e:
            return self.error_from_exception(e)
        return self._response(request, results)

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
