"""The served models: `/v1/models` and the model-name check (upstream:
vllm/entrypoints/openai/serving_models.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm.entrypoints.openai.protocol import ModelCard, ModelList, ModelPermission

if TYPE_CHECKING:
    from vllm.engine.protocol import EngineClient


@dataclass
class BaseModelPath:
    name: str
    model_path: str


class OpenAIServingModels:
    """The names a request may use in its `model` field."""

    def __init__(self, engine_client: EngineClient, base_model_paths: list[BaseModelPath]) -> None:
        if not base_model_paths:
            raise ValueError("At least one served model name is needed.")
        self.engine_client = engine_client
        self.base_model_paths = base_model_paths
        self.max_model_len = engine_client.model_config.max_model_len

    def is_base_model(self, model_name: str) -> bool:
        return any(model.name == model_name for model in self.base_model_paths)

    def model_name(self) -> str:
        """The first served name: the name responses report."""
        return self.base_model_paths[0].name

    async def show_available_models(self) -> ModelList:
        """The `/v1/models` listing: one card per served name."""
        cards = [
            ModelCard(
                id=base.name,
                max_model_len=self.max_model_len,
                root=base.model_path,
                permission=[ModelPermission()],
            )
            for base in self.base_model_paths
        ]
        return ModelList(data=cards)
