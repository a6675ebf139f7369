"""`/v1/embeddings` handler (upstream: vllm/entrypoints/pooling/embed/serving.py
ServingEmbedding): task "embed", one vector per input or conversation,
written as `encoding_format` says (../utils.py)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from vllm.entrypoints.openai.protocol_base import ErrorResponse
from vllm.entrypoints.pooling.base.serving import PoolingServingBase
from vllm.entrypoints.pooling.embed.protocol import (
    AnyEmbeddingRequest,
    EmbeddingResponse,
    EmbeddingResponseData,
)
from vllm.entrypoints.pooling.utils import (
    build_pooling_bytes_response,
    encode_pooling_output,
    get_pooling_usage,
)
from vllm.outputs import PoolingRequestOutput


class ServingEmbedding(PoolingServingBase):
    """Embeddings of texts, token ids or conversations (task "embed")."""

    async def create_embedding(
        self, request: AnyEmbeddingRequest, raw_request: Request | None = None
    ) -> EmbeddingResponse | Response | ErrorResponse:
        error = await self._check_model(request)
        if error is not None:
            return error
        request_id = self.request_id(raw_request, "embd")
        created = int(time.time())
        try:
            params = request.to_pooling_params()
            params.verify("embed", self.model_config)
            results = await self.run_pooling(request, params, request_id)
        except Exception as e:
            return self.error_from_exception(e)
        model_name = self._get_model_name(request.model)
        if request.encoding_format in ("bytes", "bytes_only"):
            return build_pooling_bytes_response(
                results,
                request_id,
                created,
                model_name,
                request.encoding_format,
                request.embed_dtype,
                request.endianness,
            )
        return self._json_response(request, results, request_id, created, model_name)

    @staticmethod
    def _json_response(
        request: AnyEmbeddingRequest,
        results: list[PoolingRequestOutput[Any]],
        request_id: str,
        created: int,
        model_name: str,
    ) -> EmbeddingResponse:
        assert request.encoding_format in ("float", "base64")
        data = [
            EmbeddingResponseData(
                index=index,
                embedding=encode_pooling_output(
                    res.outputs.data,
                    request.encoding_format,
                    request.embed_dtype,
                    request.endianness,
                ),  # type: ignore[arg-type]
            )
            for index, res in enumerate(results)
        ]
        return EmbeddingResponse(
            id=request_id,
            created=created,
            model=model_name,
            data=data,
            usage=get_pooling_usage(results),
        )
