"""Model loading entry points (upstream: vllm/model_executor/model_loader/__init__.py).

    model = get_model(vllm_config=vllm_config)

builds the architecture's model class on `device_config.device` in
`model_config.dtype`, loads its weights and returns it in eval mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader
from vllm.model_executor.model_loader.gguf_loader import GGUFModelLoader
from vllm.model_executor.model_loader.utils import (
    get_architecture_class_name,
    get_model_architecture,
)

if TYPE_CHECKING:
    from vllm.config import LoadConfig, ModelConfig, VllmConfig

_LOADERS: dict[str, type[BaseModelLoader]] = {
    "auto": DefaultModelLoader,
    "safetensors": DefaultModelLoader,
    "pt": DefaultModelLoader,
    "dummy": DummyModelLoader,
    "gguf": GGUFModelLoader,
}


def get_model_loader(
    load_config: LoadConfig, model_config: ModelConfig | None = None
) -> BaseModelLoader:
    """The loader for `load_config.load_format`; "auto" picks the GGUF loader
    when the model is a .gguf file."""
    fmt = load_config.load_format
    if fmt not in _LOADERS:
        raise ValueError(f"Unknown load_format {fmt!r}; choose one of {sorted(_LOADERS)}.")
    if fmt == "auto" and model_config is not None and getattr(model_config, "gguf_file", None):
        return GGUFModelLoader(load_config)
    return _LOADERS[fmt](load_config)


def get_model(
    *, vllm_config: VllmConfig, model_config: ModelConfig | None = None, prefix: str = ""
) -> nn.Module:
    """Build and load the model described by `vllm_config` (or `model_config`).
    `prefix` goes before every layer name (a draft model's attention layers
    register as "draft_model...." beside the target's)."""
    model_config = model_config or vllm_config.model_config
    if model_config is None:
        raise ValueError("get_model() needs a model_config.")
    loader = get_model_loader(vllm_config.load_config, model_config)
    return loader.load_model(vllm_config=vllm_config, model_config=model_config, prefix=prefix)


__all__ = [
    "BaseModelLoader",
    "DefaultModelLoader",
    "DummyModelLoader",
    "GGUFModelLoader",
    "get_architecture_class_name",
    "get_model",
    "get_model_architecture",
    "get_model_loader",
]
