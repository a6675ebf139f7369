"""The runtime LoRA routes (upstream: vllm/entrypoints/serve/lora/api_router.py).

    POST /v1/load_lora_adapter    {"lora_name", "lora_path", "load_inplace"?}
    POST /v1/unload_lora_adapter  {"lora_name"}

200 with a plain-text "Success: ..." body; errors in the envelope with their
status (400 bad input or an adapter the engine refuses, 404 an adapter path
or name that does not exist). Without VLLM_ALLOW_RUNTIME_LORA_UPDATING the
routes do not exist (404, as any unknown path); with --api-key they need the
key like every other route.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import Response

import vllm.envs as envs
from vllm.entrypoints.openai.openapi import TOKENIZE_RESPONSES
from vllm.entrypoints.openai.protocol import ErrorResponse
from vllm.entrypoints.openai.serving_models import OpenAIServingModels
from vllm.entrypoints.openai.utils import error_json, validate_json_request
from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
from vllm.logger import init_logger

logger = init_logger(__name__)

router = APIRouter()


def models(request: Request) -> OpenAIServingModels:
    return request.app.state.openai_serving_models


def _respond(result: ErrorResponse | str) -> Response:
    if isinstance(result, str):
        return Response(status_code=200, content=result)
    return error_json(result)


@router.post(
    "/v1/load_lora_adapter",
    dependencies=[Depends(validate_json_request)],
    response_class=Response,
    responses=TOKENIZE_RESPONSES,
)
async def load_lora_adapter(request: LoadLoRAAdapterRequest, raw_request: Request) -> Response:
    return _respond(await models(raw_request).load_lora_adapter(request))


@router.post(
    "/v1/unload_lora_adapter",
    dependencies=[Depends(validate_json_request)],
    response_class=Response,
    responses=TOKENIZE_RESPONSES,
)
async def unload_lora_adapter(request: UnloadLoRAAdapterRequest, raw_request: Request) -> Response:
    return _respond(await models(raw_request).unload_lora_adapter(request))


def attach_router(app: FastAPI) -> None:
    """Add the routes when VLLM_ALLOW_RUNTIME_LORA_UPDATING is set."""
    if not envs.VLLM_ALLOW_RUNTIME_LORA_UPDATING:
        return
    logger.warning(
        "LoRA dynamic loading & unloading is enabled in the API server. "
        "This should ONLY be used for local development!"
    )
    app.include_router(router)
