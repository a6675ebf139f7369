"""The served models: `/v1/models` and the model-name check (upstream:
vllm/entrypoints/openai/serving_models.py).

One instance per engine. A server with a second (embedding) engine links the
two as peers: `/v1/models` lists every model of the server, and a request that
names a peer's model on this engine's routes gets `wrong_api_message` (a 400)
instead of "does not exist" (a 404).
"""

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

    def __init__(
        self,
        engine_client: EngineClient,
        base_model_paths: list[BaseModelPath],
        supported_tasks: tuple[str, ...] | None = None,
    ) -> None:
        if not base_model_paths:
            raise ValueError("At least one served model name is needed.")
        self.engine_client = engine_client
        self.base_model_paths = base_model_paths
        self.max_model_len = engine_client.model_config.max_model_len
        # The engine's tasks (`EngineClient.get_supported_tasks`), shown on
        # the model cards; None: not reported.
        self.supported_tasks = supported_tasks
        # The other engines' models of the same server.
        self.peers: list[OpenAIServingModels] = []

    def link_peer(self, other: OpenAIServingModels) -> None:
        """Make `self` and `other` peers (both ways)."""
        self.peers.append(other)
        other.peers.append(self)

    def is_base_model(self, model_name: str) -> bool:
        return any(model.name == model_name for model in self.base_model_paths)

    def model_name(self) -> str:
        """The first served name: the name responses report."""
        return self.base_model_paths[0].name

    def wrong_api_message(self, model_name: str) -> str | None:
        """The error for a model that a peer engine serves (None: no peer
        serves it either, i.e. the model does not exist)."""
        for peer in self.peers:
            if peer.is_base_model(model_name):
                tasks = ", ".join(peer.supported_tasks or ()) or "unknown"
                here = ", ".join(f"`{base.name}`" for base in self.base_model_paths)
                return (
                    f"The model `{model_name}` does not support this API (its tasks: "
                    f"{tasks}); this API is served by {here}."
                )
        return None

    def model_cards(self) -> list[ModelCard]:
        """This engine's cards: one per served name."""
        tasks = list(self.supported_tasks) if self.supported_tasks is not None else None
        return [
            ModelCard(
                id=base.name,
                max_model_len=self.max_model_len,
                root=base.model_path,
                permission=[ModelPermission()],
                supported_tasks=tasks,
            )
            for base in self.base_model_paths
        ]

    async def show_available_models(self) -> ModelList:
        """The `/v1/models` listing: this engine's models, then its peers'."""
        cards = self.model_cards()
        for peer in self.peers:
            cards += peer.model_cards()
        return ModelList(data=cards)
