"""The pooling routes of `vllm serve` (upstream: vllm/entrypoints/pooling/):
`/pooling` (`pooling/`, any pooling task), `/v1/embeddings` (`embed/`),
`/classify` (`classify/`) and `/score` + `/rerank` (`scoring/`: tasks
"classify" or "embed"), sharing the input handling of `base/`. Each route is
registered only when the served model's pooler supports its task
(`EngineClient.get_supported_tasks`); a generative model serves none of them
(404, as any unknown path)."""

from __future__ import annotations

from types import EllipsisType
from typing import Any

from fastapi import FastAPI

from vllm.engine.protocol import EngineClient
from vllm.entrypoints.openai.serving_models import OpenAIServingModels
from vllm.tasks import POOLING_TASKS


def _pools(supported_tasks: tuple[str, ...]) -> bool:
    return any(task in POOLING_TASKS for task in supported_tasks)


def _scores(supported_tasks: tuple[str, ...]) -> bool:
    # A cross-encoder ("classify", one label) or the cosine of two
    # embeddings ("embed").
    return "classify" in supported_tasks or "embed" in supported_tasks


def _one_label(model_config: Any) -> bool:
    return getattr(model_config.hf_config, "num_labels", 0) == 1


def register_pooling_api_routers(app: FastAPI, supported_tasks: tuple[str, ...]) -> None:
    if not _pools(supported_tasks):
        # 404s that name the model (see base/api_router.py).
        from vllm.entrypoints.pooling.base.api_router import unsupported_pooling_router

        app.include_router(unsupported_pooling_router(supported_tasks))
    if _pools(supported_tasks):
        from vllm.entrypoints.pooling.pooling.api_router import router as pooling_router

        app.include_router(pooling_router)
    if "classify" in supported_tasks:
        from vllm.entrypoints.pooling.classify.api_router import router as classify_router

        app.include_router(classify_router)
    if "embed" in supported_tasks:
        from vllm.entrypoints.pooling.embed.api_router import router as embed_router

        app.include_router(embed_router)
    if _scores(supported_tasks):
        from vllm.entrypoints.pooling.scoring.api_router import router as score_router

        app.include_router(score_router)


def init_pooling_state(
    engine_client: EngineClient,
    state: Any,
    models: OpenAIServingModels,
    supported_tasks: tuple[str, ...],
    *,
    chat_template: str | None | EllipsisType = ...,
) -> None:
    """The pooling routes' serving objects, on `engine_client`. chat_template:
    the template of `messages` inputs; `...` (default): the server's
    --chat-template (a second, embedding engine passes its own)."""
    from vllm.entrypoints.pooling.classify.serving import ServingClassification
    from vllm.entrypoints.pooling.embed.serving import ServingEmbedding
    from vllm.entrypoints.pooling.pooling.serving import ServingPooling
    from vllm.entrypoints.pooling.scoring.serving import ServingScores

    # The chat template of the pooling routes' `messages` inputs: the
    # server's --chat-template / --trust-request-chat-template.
    tokenization = getattr(state, "openai_serving_tokenization", None)
    if chat_template is ...:
        chat_template = getattr(tokenization, "chat_template", None)
    chat: dict[str, Any] = {
        "chat_template": chat_template,
        "trust_request_chat_template": getattr(tokenization, "trust_request_chat_template", False),
    }
    state.openai_serving_pooling = (
        ServingPooling(engine_client, models, supported_tasks=supported_tasks, **chat)
        if _pools(supported_tasks)
        else None
    )

    state.openai_serving_embedding = (
        ServingEmbedding(engine_client, models, **chat) if "embed" in supported_tasks else None
    )
    state.openai_serving_classification = (
        ServingClassification(engine_client, models, **chat)
        if "classify" in supported_tasks
        else None
    )
    # As upstream v0.28's enable_scoring_api: an embedding model, or a
    # classifier with one label (another classifier's routes answer 501).
    state.serving_scores = (
        ServingScores(engine_client, models)
        if _scores(supported_tasks)
        and ("embed" in supported_tasks or _one_label(engine_client.model_config))
        else None
    )
