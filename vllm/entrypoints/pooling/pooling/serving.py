"""`/pooling` handler (upstream: vllm/entrypoints/pooling/pooling/serving.py
ServingPooling): the pooler's output for the model's pooling task, returned
as is.

The model's pooling task (ModelConfig.get_pooling_task) is
`--pooler-config.task` if set, else the first supported of embed, classify,
token_embed, token_classify. As upstream v0.28 a request's `task` must be
that one: a task the model does not support is a 400 naming the supported
ones, another supported task a 400 pointing at --pooler-config.task; "score"
/ "encode" are refused by name and `dimensions` is refused."""

from __future__ import annotations

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
from vllm.exceptions import VLLMValidationError
from vllm.pooling_params import PoolingParams
from vllm.tasks import POOLING_TASKS, PoolingTask


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
            t for t in POOLING_TASKS if t in supported_tasks
        )
        pooling_task = self.model_config.get_pooling_task(self.supported_tasks)
        if pooling_task is None:
            raise ValueError("ServingPooling needs a model with a pooling task")
        self.pooling_task: PoolingTask = pooling_task

    async def create_pooling(
        self, request: AnyPoolingRequest, raw_request: Request | None = None
    ) -> PoolingResponse | Response | ErrorResponse:
        return await self.create_encoded(
            request,
            raw_request,
            "pooling",
            lambda: self._pooling_params(request),
            lambda index, data: PoolingResponseData(index=index, data=data),
            PoolingResponse,
        )

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
        if task != self.pooling_task:
            # Upstream v0.28: one pooling task per server.
            raise VLLMValidationError(
                f"Try switching the model's pooling_task via --pooler-config.task {task}.",
                parameter="task",
            )
        params = request.to_pooling_params()
        params.verify(task, self.model_config)
        return params
