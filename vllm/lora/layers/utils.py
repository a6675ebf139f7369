"""The batch -> adapter mapping handed to the Punica wrapper, and the
helpers the LoRA layers share (upstream: vllm/lora/layers/utils.py)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from vllm.config.lora import LoRAConfig


class LoRAMappingType(Enum):
    LANGUAGE = 1
    TOWER = 2
    CONNECTOR = 3


@dataclass
class LoRAMapping:
    """`index_mapping[t]`: the LoRA id (`LoRARequest.lora_int_id`, 0 = none)
    of batch token t; `prompt_mapping[s]`: the same per sampled row."""

    index_mapping: tuple[int, ...]
    prompt_mapping: tuple[int, ...]
    is_prefill: bool = False
    type: LoRAMappingType = LoRAMappingType.LANGUAGE

    def __post_init__(self) -> None:
        self.index_mapping = tuple(self.index_mapping)
        self.prompt_mapping = tuple(self.prompt_mapping)


def _get_lora_device(base_layer: nn.Module) -> torch.device:
    """Where a layer's LoRA tensors live: the device of its weight (a dense
    `weight`, or a quantized layer's packed tensor)."""
    for name in ("weight", "weight_packed", "qweight", "_packed_weight"):
        tensor = getattr(base_layer, name, None)
        if isinstance(tensor, torch.Tensor):
            return tensor.device
    raise ValueError(f"Unsupported base layer: {base_layer}")


def _resolve_lora_dtype(lora_config: LoRAConfig, base_layer: nn.Module) -> torch.dtype:
    """`lora_config.lora_dtype`, "auto" (not yet resolved against the model
    config) meaning the base layer's parameter dtype."""
    dtype = lora_config.lora_dtype
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        params_dtype = getattr(base_layer, "params_dtype", None)
        if isinstance(params_dtype, torch.dtype):
            return params_dtype
        return next(base_layer.parameters()).dtype
    return {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]


_CanReplace = Callable[..., bool]


def _lora_config_arg(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The lora_config of a can_replace_layer(cls, source_layer, lora_config, ...) call."""
    return kwargs["lora_config"] if "lora_config" in kwargs else args[2]


def _not_fully_sharded_can_replace(can_replace: _CanReplace) -> _CanReplace:
    """Decorates `can_replace_layer`: also requires fully_sharded_loras off
    (unless called with decorate=False by a sharded subclass)."""

    @functools.wraps(can_replace)
    def dec(*args: Any, **kwargs: Any) -> bool:
        decorate = kwargs.pop("decorate", True)
        condition = not _lora_config_arg(args, kwargs).fully_sharded_loras if decorate else True
        return can_replace(*args, **kwargs) and condition

    return dec


def _fully_sharded_can_replace(can_replace: _CanReplace) -> _CanReplace:
    """Decorates `can_replace_layer`: also requires fully_sharded_loras on."""

    @functools.wraps(can_replace)
    def dec(*args: Any, **kwargs: Any) -> bool:
        return bool(
            can_replace(*args, **kwargs) and _lora_config_arg(args, kwargs).fully_sharded_loras
        )

    return dec
