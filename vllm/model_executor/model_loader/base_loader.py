"""The model loader interface (upstream: vllm/model_executor/model_loader/base_loader.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch
from torch import nn

from vllm.logger import init_logger
from vllm.model_executor.model_loader.utils import (
    initialize_model,
    model_weight_bytes,
    process_weights_after_loading,
    set_default_torch_dtype,
)

if TYPE_CHECKING:
    from vllm.config import LoadConfig, ModelConfig, VllmConfig

logger = init_logger(__name__)


class BaseModelLoader(ABC):
    """Builds a model and fills its weights from one kind of checkpoint."""

    def __init__(self, load_config: LoadConfig) -> None:
        self.load_config = load_config

    @abstractmethod
    def download_model(self, model_config: ModelConfig) -> None:
        """Make the checkpoint available locally (here: check that it is)."""
        raise NotImplementedError

    @abstractmethod
    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        """Fill every parameter of an already constructed model."""
        raise NotImplementedError

    def load_model(
        self, vllm_config: VllmConfig, model_config: ModelConfig, prefix: str = ""
    ) -> nn.Module:
        """Construct the model on the target device in the model dtype (its
        layer names under `prefix`), load its weights and return it in eval mode."""
        target_device = torch.device(vllm_config.device_config.device)
        assert isinstance(model_config.dtype, torch.dtype), "ModelConfig resolves dtype"
        with set_default_torch_dtype(model_config.dtype):
            with target_device:
                model = initialize_model(
                    vllm_config=vllm_config, model_config=model_config, prefix=prefix
                )
            logger.debug("Loading weights on %s ...", target_device)
            self.load_weights(model, model_config)
        process_weights_after_loading(model, model_config, target_device)
        weight_bytes = model_weight_bytes(model)
        # Read by the model runners (upstream logs "Model loading took X GiB").
        model.model_weight_bytes = weight_bytes  # type: ignore[assignment]
        logger.info(
            "Model weights take %.4f GiB (%d bytes)%s",
            weight_bytes / (1 << 30),
            weight_bytes,
            f", quantization={model_config.quantization}" if model_config.quantization else "",
        )
        return model.eval()
