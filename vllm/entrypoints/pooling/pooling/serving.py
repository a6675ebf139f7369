"""`/pooling` handler (upstream: vllm/entrypoints/pooling/pooling/serving.py
ServingPooling): any pooling task the model supports, the pooler's output
returned as is.

Without `task` the model's default task is used: the first of its supported
pooling tasks in POOLING_TASKS order (embed, classify, score, token_embed,
token_classify). A task the model does not support is a 400 naming the
supported ones."""

from __future__ import annotations

import base64
from typing import Any

import torch
from fastapi import Request

from vllm.engine.protocol import EngineClient
from vllm.entrypoints.openai.protocol_base import ErrorResponse, UsageInfo
from vllm.entrypoints.openai.serving_models import OpenAIServingModels
from vllm.entrypoints.pooling.base.serving import PoolingServingBase
from vllm.entrypoints.pooling.pooling.protocol import (
    PoolingRequest,
    PoolingResponse,
    PoolingResponseData,
)
from vllm.exceptions import VLLMValidationError
from vllm.outputs import PoolingRequestOutput
from vllm.pooling_params import PoolingParams
from vllm.tasks import POOLING_TASKS, PoolingTask


def encode_tensor_base64(data: torch.Tensor) -> str:
    """Little-endian float32 bytes of the flattened tensor (row after row), base64."""
    raw = data.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4").tobytes()
    return base64.b64encode(raw).decode("ascii")


class ServingPooling(PoolingServingBase):
    """The pooler's output for any supported pooling task."""

    what = "pooling"

    def __init__(
        self,
        engine_client: EngineClient,
        models: OpenAIServingModels,
        *,
        supported_tasks: tuple[str, ...],
    ) -> None:
        super().__init__(engine_client, models)
        self.supported_tasks: tuple[PoolingTask, ...] = tuple(
            t for t in POOLING_TASKS if t in supported_tasks
        )
        if not self.supported_tasks:
            raise ValueError("ServingPooling needs a model with a pooling task")
        self.pooling_task: PoolingTask = self.supported_tasks[0]

    async def create_pooling(
        self, request: PoolingRequest, raw_request: Request | None = None
    ) -> PoolingResponse | ErrorResponse:
        error = await self._check_model(request)
        if error is not None:
            return error
        try:
            params = self._pooling_params(request)
            results = await self.run_pooling(request, params, self.request_id(raw_request, "pool"))
        except Exception as e:
            return self.error_from_exception(e)
        return self._response(request, results)

    def _pooling_params(self, request: PoolingRequest) -> PoolingParams:
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
        params = PoolingParams(normalize=request.normalize, use_activation=request.use_activation)
        params.verify(task, self.model_config)
        return params

    def _response(
        self, request: PoolingRequest, results: list[PoolingRequestOutput[Any]]
    ) -> PoolingResponse:
        data = []
        num_prompt_tokens = 0
        for index, res in enumerate(results):
            tensor = res.outputs.data
            values: list[list[float]] | list[float] | str = (
                encode_tensor_base64(tensor)
                if request.encoding_format == "base64"
                else tensor.float().tolist()
            )
            data.append(PoolingResponseData(index=index, data=values))
            num_prompt_tokens += len(res.prompt_token_ids)
        return PoolingResponse(
            model=self._get_model_name(request.model),
            data=data,
            usage=UsageInfo(prompt_tokens=num_prompt_tokens, total_tokens=num_prompt_tokens),
        )
