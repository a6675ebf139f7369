"""Building a model from its config (upstream: vllm/model_executor/model_loader/utils.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from vllm.config import set_current_vllm_config

if TYPE_CHECKING:
    from vllm.config import ModelConfig, VllmConfig


@contextlib.contextmanager
def set_default_torch_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Create parameters in `dtype` inside the block; restore the old default after."""
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old_dtype)


def get_model_architecture(model_config: ModelConfig) -> tuple[type[nn.Module], str]:
    """(model class, architecture name) from the registry; unknown ones raise
    a ValueError that lists the supported architectures."""
    from vllm.model_executor.models.adapters import (
        as_embedding_model,
        as_reward_model,
        as_seq_cls_model,
    )
    from vllm.model_executor.models.registry import ModelRegistry

    model_cls, arch = ModelRegistry.resolve_model_cls(model_config.architectures, model_config)
    # --convert (runner="pooling" over a generative class), as upstream.
    convert_type = getattr(model_config, "convert_type", "none")
    if getattr(model_cls, "is_pooling_model", False):
        pass  # already a pooling model
    elif convert_type == "embed":
        model_cls = as_embedding_model(model_cls)
    elif convert_type == "classify":
        model_cls = as_seq_cls_model(model_cls)
    elif convert_type == "reward":
        model_cls = as_reward_model(model_cls)
    return model_cls, arch


def get_architecture_class_name(model_config: ModelConfig) -> str:
    return get_model_architecture(model_config)[1]


def initialize_model(
    vllm_config: VllmConfig,
    *,
    prefix: str = "",
    model_class: type[nn.Module] | None = None,
    model_config: ModelConfig | None = None,
) -> nn.Module:
    """Construct the model (uninitialised weights) with `vllm_config` current,
    so that layers (attention) can register themselves in it."""
    if model_class is None:
        model_config = model_config or vllm_config.model_config
        if model_config is None:
            raise ValueError("initialize_model needs a model config or a model class.")
        model_class, _ = get_model_architecture(model_config)
    configure_quant_config(vllm_config, model_class)
    with set_current_vllm_config(vllm_config):
        model = model_class(vllm_config=vllm_config, prefix=prefix)
    verify_quantized_layers(vllm_config, model)
    return model


def configure_quant_config(vllm_config: VllmConfig, model_class: type[nn.Module]) -> None:
    """Give the quant config the model's fused-module map (upstream's
    `configure_quant_config`), so per-module rules apply to fused layers."""
    quant_config = vllm_config.quant_config
    if quant_config is not None:
        mapping = getattr(model_class, "packed_modules_mapping", None) or {}
        quant_config.packed_modules_mapping = dict(mapping)


def verify_quantized_layers(vllm_config: VllmConfig, model: nn.Module) -> None:
    """A quantized checkpoint needs a model class that hands its linears the
    quant config; one that does not would meet tensors it has no parameter
    for, so it is refused here, naming the method and the architecture."""
    quant_config = vllm_config.quant_config
    if quant_config is None:
        return
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None and type(method).__name__ != "UnquantizedLinearMethod":
            return
    raise ValueError(
        f"{type(model).__name__} does not support quantization method "
        f"{quant_config.get_name()!r} here (no layer took a quantized method)."
    )


def load_model_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
    """`model.load_weights(weights)`: each model class maps its checkpoint's
    tensors onto its parameters; the names of the parameters it loaded."""
    load_weights = getattr(model, "load_weights", None)
    if load_weights is None:
        raise TypeError(f"{type(model).__name__} does not define load_weights.")
    return set(load_weights(weights))


def process_weights_after_loading(
    model: nn.Module, model_config: ModelConfig, target_device: torch.device
) -> None:
    """Let modules repack their weights once loaded (a hook quantized layers use)."""
    for module in model.modules():
        hook = getattr(module, "process_weights_after_loading", None)
        if callable(hook):
            hook(model_config.dtype)


def model_weight_bytes(model: nn.Module) -> int:
    """Bytes held by the model's parameters and buffers, as stored (quantized
    weights at their packed size); storage shared by tied weights counts once.
    Packed CPU weights (`_packed_weight`, not a parameter) count too."""
    seen: set[int] = set()
    total = 0
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [
        packed
        for module in model.modules()
        if isinstance(packed := getattr(module, "_packed_weight", None), torch.Tensor)
    ]
    for tensor in tensors:
        if tensor.layout != torch.strided:  # oneDNN's opaque layout: count its elements
            total += tensor.numel() * tensor.element_size()
            continue
        storage = tensor.untyped_storage()
        if storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total
