"""The interfaces every quantization method implements
(upstream: vllm/model_executor/layers/quantization/base_config.py).

A `QuantizationConfig` is parsed from a checkpoint's `quantization_config`
(config.json) and hands each layer its `QuantizeMethodBase`: the method
creates the layer's parameters (`create_weights`, named as the checkpoint
names them, so the ordinary weight loaders fill them), repacks them once
loaded (`process_weights_after_loading`) and runs the layer (`apply`).
This module imports nothing from vllm: the config layer reads it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import nn


class QuantizeMethodBase(ABC):
    """How one layer's weights are stored and multiplied."""

    @abstractmethod
    def create_weights(
        self, layer: nn.Module, *weight_args: Any, **extra_weight_attrs: Any
    ) -> None:
        """Register the layer's weight parameters on `layer`."""
        raise NotImplementedError

    @abstractmethod
    def apply(self, layer: nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The layer's output from its (processed) weights."""
        raise NotImplementedError

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Repack the loaded weights for the kernel (nothing by default)."""
        return None


class QuantizationConfig(ABC):
    """A checkpoint's quantization, as parsed from its `quantization_config`."""

    def __init__(self) -> None:
        # Fused module -> the checkpoint modules it stacks ("qkv_proj" ->
        # ["q_proj", "k_proj", "v_proj"]); the model loader fills it from the
        # model class so per-module rules (ignore lists) apply to fused layers.
        self.packed_modules_mapping: dict[str, list[str]] = {}

    @abstractmethod
    def get_name(self) -> str:
        """The method's name, as `-q/--quantization` spells it."""
        raise NotImplementedError

    @abstractmethod
    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        """Activation dtypes the method's kernels take."""
        raise NotImplementedError

    @classmethod
    @abstractmethod
    def get_min_capability(cls) -> int:
        """Minimum CUDA compute capability (x10); CPU methods ignore it."""
        raise NotImplementedError

    @staticmethod
    def get_config_filenames() -> list[str]:
        """Extra files holding the config (none: it is in config.json)."""
        return []

    @classmethod
    @abstractmethod
    def from_config(cls, config: dict[str, Any]) -> QuantizationConfig:
        """Parse the checkpoint's `quantization_config` dict; raise a
        ValueError naming anything this build cannot run."""
        raise NotImplementedError

    @abstractmethod
    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        """The method for `layer` (named `prefix` in the model), or None
        when this config does not handle that kind of layer."""
        raise NotImplementedError

    @staticmethod
    def get_from_keys(config: dict[str, Any], keys: list[str]) -> Any:
        """The value of the first of `keys` present in `config`."""
        for key in keys:
            if key in config:
                return config[key]
        raise ValueError(f"Cannot find any of {keys} in the model's quantization config.")

    @staticmethod
    def get_from_keys_or(config: dict[str, Any], keys: list[str], default: Any) -> Any:
        """As `get_from_keys`, with `default` when none is present."""
        try:
            return QuantizationConfig.get_from_keys(config, keys)
        except ValueError:
            return default


class CPUQuantizationConfig(QuantizationConfig):
    """A method whose kernels here are CPU ones (every method built here):
    the activation dtypes torch's CPU kernels take (upstream's CUDA kernels
    take half / bfloat16 only), and no CUDA capability (-1: `VllmConfig`
    refuses another device rather than dequantizing)."""

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.float32, torch.float16, torch.bfloat16]

    @classmethod
    def get_min_capability(cls) -> int:
        return -1
