"""Random weights, for measuring speed and memory without a checkpoint
(upstream: vllm/model_executor/model_loader/dummy_loader.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.model_executor.model_loader.weight_utils import initialize_dummy_weights

if TYPE_CHECKING:
    from vllm.config import ModelConfig


class DummyModelLoader(BaseModelLoader):
    """`load_format="dummy"`: every parameter uniform in [-1e-3, 1e-3)."""

    def download_model(self, model_config: ModelConfig) -> None:
        pass  # nothing to fetch

    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        initialize_dummy_weights(model, seed=model_config.seed)
