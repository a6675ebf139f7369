"""`/pooling` handler (upstream: vllm/entrypoints/pooling/pooling/serving.py
ServingPooling): any pooling task the model supports, the pooler's output
returned as is.

Without `task` the model's pooling task is used: the first of its supported
pooling tasks in upstream's priority order (embed, classify, token_embed,
token_classify; "score" / "encode" are refused by name). A task the model does not
support is a 400 naming the supported ones; `dimensions` is refused, as
upstream. Upstream v0.28 also refuses a supported task other than the
model's pooling task (its `--pooler-config.task` picks that one); PoolerConfig
has no `task` here, so every supported task is served (e.g. token_embed on an
embedding model)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from vllm.engine.protocol import EngineClient
from vllm.entrypoints.openai.protocol_base import ErrorResponse
from vllm.entrypoints.openai.serving_models import OpenAIServingModels
from vllm.entrypoints.pooling.base.serving import PoolingServingBase
from vllm.entrypoints.pooling.pooling.protocol import (
    AnyPoolingRequest,
    PoolingResponse,
    PoolingResponseData,
)
from vllm.entrypoints.pooling.utils import (
    build_pooling_bytes_response,
    encode_pooling_output,
    get_pooling_usage,
)
from vllm.exceptions import VLLMValidationError
from vllm.outputs import PoolingRequestOutput
from vllm.pooling_params import PoolingParams
from vllm.tasks import PoolingTask

# Upstream's ModelConfig.get_pooling_task order.
_TASK_PRIORITY: tuple[PoolingTask, ...] = ("embed", "classify", "token_embed", "token_classify")


class ServingPooling(PoolingServingBase):
    """The pooler's output for any supported pooling task."""

    def __init__(
        self,
        engine_client: EngineClient,
        models: OpenAIServingModels,
        *,
        supported_tasks: tuple[str, ...],
        chat_template: str | None = None,
        trust_request_chat_template: bool = False,
    ) -> None:
        super().__init__(
            engine_client,
            models,
            chat_template=chat_template,
            trust_request_chat_template=trust_request_chat_template,
        )
        self.supported_tasks: tuple[PoolingTask, ...] = tuple(
            t for t in _TASK_PRIORITY if t in supported_tasks
        )
        if not self.supported_tasks:
            raise ValueError("ServingPooling needs a model with a pooling task")
        self.pooling_task: PoolingTask = self.supported_tasks[0]

    async def create_pooling(
        self, request: AnyPoolingRequest, raw_request: Request | None = None
    ) -> PoolingResponse | Response | ErrorResponse:
        error = await self._check_model(request)
        if error is not None:
            return error
        request_id = self.request_id(raw_request, "pooling")
        created = int(time.time())
        try:
            params = self._pooling_params(request)
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

    def _pooling_params(self, request: AnyPoolingRequest) -> PoolingParams:
        if request.dimensions is not None:
            raise VLLMValidationError(
                "dimensions is currently not supported", parameter="dimensions"
            )
        task = request.task or self.pooling_task
        if task not in self.supported_tasks:
            raise VLLMValidationError(
                f"Unsupported task: {task!r} Supported tasks: {self.supported_tasks}",
                parameter="task",
            )
        params = request.to_pooling_params()
        params.verify(task, self.model_config)
        return params

    @staticmethod
    def _json_response(
        request: AnyPoolingRequest,
        results: list[PoolingRequestOutput[Any]],
        request_id: str,
        created: int,
        model_name: str,
    ) -> PoolingResponse:
        assert request.encoding_format in ("float", "base64")
        data = [
            PoolingResponseData(
                index=index,
                data=encode_pooling_output(
                    res.outputs.data,
                    request.encoding_format,
                    request.embed_dtype,
                    request.endianness,
                ),
            )
            for index, res in enumerate(results)
        ]
        return PoolingResponse(
            id=request_id,
            created=created,
            model=model_name,
            data=data,
            usage=get_pooling_usage(results),
        )
