"""`/classify` handler (upstream: vllm/entrypoints/pooling/classify/serving.py
ServingClassification): task "classify", one row of class probabilities
per input or conversation."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from vllm.entrypoints.openai.protocol_base import ErrorResponse, UsageInfo
from vllm.entrypoints.pooling.base.serving import PoolingServingBase
from vllm.entrypoints.pooling.classify.protocol import (
    AnyClassificationRequest,
    ClassificationData,
    ClassificationResponse,
)
from vllm.outputs import ClassificationOutput, PoolingRequestOutput


class ServingClassification(PoolingServingBase):
    """Class probabilities of texts or token ids (task "classify")."""

    async def create_classify(
        self, request: AnyClassificationRequest, raw_request: Request | None = None
    ) -> ClassificationResponse | ErrorResponse:
        error = await self._check_model(request)
        if error is not None:
            return error
        lora_request = self._maybe_get_adapters(request)
        try:
            params = request.to_pooling_params()
            params.verify("classify", self.model_config)
            request_id = self.request_id(raw_request, "classify")
            results = await self.run_pooling(request, params, request_id, lora_request)
        except Exception as e:
            return self.error_from_exception(e)
        return self._response(request, results, request_id)

    def _label(self, index: int) -> str | None:
        id2label = getattr(self.model_config.hf_config, "id2label", None) or {}
        label = id2label.get(index)
        return None if label is None else str(label)

    def _response(
        self,
        request: AnyClassificationRequest,
        results: list[PoolingRequestOutput[Any]],
        request_id: str,
    ) -> ClassificationResponse:
        data = []
        num_prompt_tokens = 0
        for index, res in enumerate(results):
            probs = ClassificationOutput.from_base(res.outputs).probs
            best = max(range(len(probs)), key=probs.__getitem__)
            data.append(
                ClassificationData(
                    index=index, label=self._label(best), probs=probs, num_classes=len(probs)
                )
            )
            num_prompt_tokens += len(res.prompt_token_ids)
        return ClassificationResponse(
            id=request_id,
            model=self._get_model_name(request.model),
            data=data,
            usage=UsageInfo(prompt_tokens=num_prompt_tokens, total_tokens=num_prompt_tokens),
        )
