"""Loads HF checkpoints from a local directory: *.safetensors, else
pytorch_model*.bin (upstream: vllm/model_executor/model_loader/default_loader.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from vllm.logger import init_logger
from vllm.model_executor.layers.fused_moe.expert_map_manager import non_local_expert_filter
from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.model_executor.model_loader.utils import load_model_weights
from vllm.model_executor.model_loader.weight_utils import (
    find_weight_files,
    pt_weights_iterator,
    safetensors_weights_iterator,
)

if TYPE_CHECKING:
    from vllm.config import ModelConfig

logger = init_logger(__name__)


class DefaultModelLoader(BaseModelLoader):
    """Model loader for HF-format checkpoints in a local directory."""

    def _model_dir(self, model_config: ModelConfig) -> str:
        path = model_config.model
        if not os.path.isdir(path):
            raise ValueError(
                f"Model path {path!r} is not a local directory with HF "
                "weights (GGUF files use load_format='gguf')."
            )
        return path

    def download_model(self, model_config: ModelConfig) -> None:
        find_weight_files(self._model_dir(model_config))

    def get_all_weights(
        self, model_config: ModelConfig, model: nn.Module
    ) -> Generator[tuple[str, torch.Tensor], None, None]:
        files, use_safetensors = find_weight_files(self._model_dir(model_config))
        if self.load_config.load_format == "safetensors" and not use_safetensors:
            raise ValueError(f"load_format='safetensors' but {model_config.model!r} has none.")
        if use_safetensors and self.load_config.load_format != "pt":
            # Expert parallelism: other ranks' experts are not read.
            yield from safetensors_weights_iterator(files, non_local_expert_filter(model))
        else:
            yield from pt_weights_iterator(files)

    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        start = time.perf_counter()
        weights_to_load = _checkpoint_parameter_names(model)
        current: list[str] = []  # the tensor being loaded, for errors

        def named(
            weights: Iterator[tuple[str, torch.Tensor]],
        ) -> Iterator[tuple[str, torch.Tensor]]:
            it = iter(weights)
            while True:
                current.clear()  # an error reading the files names the file itself
                try:
                    name, tensor = next(it)
                except StopIteration:
                    return
                current.append(name)
                yield name, tensor

        try:
            loaded = load_model_weights(model, named(self.get_all_weights(model_config, model)))
        except (ValueError, RuntimeError) as e:
            if not current or type(e) not in (ValueError, RuntimeError):
                raise
            # Same exception type, with the tensor and checkpoint named.
            raise type(e)(
                f"Loading checkpoint tensor {current[0]!r} of {model_config.model!r} failed: {e}"
            ) from e
        missing = weights_to_load - loaded
        if missing:
            raise ValueError(
                f"Following weights were not initialized from checkpoint: {sorted(missing)}"
            )
        logger.info("Loading weights took %.2f seconds", time.perf_counter() - start)


def _checkpoint_parameter_names(model: nn.Module) -> set[str]:
    """The parameters the checkpoint must provide: all but those of modules
    that loaded their own weights when built (`weights_preloaded`, e.g. the
    sentence-transformers Dense projector read from its own folder)."""
    preloaded = {
        f"{prefix}.{name}" if prefix else name
        for prefix, module in model.named_modules()
        if getattr(module, "weights_preloaded", False)
        for name, _ in module.named_parameters()
    }
    return {name for name, _ in model.named_parameters()} - preloaded
