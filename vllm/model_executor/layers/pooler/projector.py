"""The sentence-transformers Dense projector after pooling (upstream keeps
`_load_st_projector` in vllm/model_executor/models/adapters.py, which
re-exports it from here).

A Dense module dir holds config.json {in_features, out_features, bias,
activation_function} and the weights `linear.weight` [out, in] /
`linear.bias` [out] (model.safetensors or pytorch_model.bin).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
import torch.nn as nn

if TYPE_CHECKING:
    from vllm.config.model import ModelConfig

# sentence_transformers Dense activation names -> modules.
_ST_DENSE_ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": nn.Identity,
    "torch.nn.modules.activation.Tanh": nn.Tanh,
}


class _STProjector(nn.Sequential):
    """The Dense layers in order. Their weights come from the Dense folders,
    not the model's checkpoint: the loader does not expect them there (see
    DefaultModelLoader's `weights_preloaded`)."""

    weights_preloaded = True


def _load_dense_weights(folder: str) -> dict[str, torch.Tensor]:
    st_path = os.path.join(folder, "model.safetensors")
    if os.path.isfile(st_path):
        from safetensors.torch import load_file

        return load_file(st_path)
    bin_path = os.path.join(folder, "pytorch_model.bin")
    if os.path.isfile(bin_path):
        return torch.load(bin_path, map_location="cpu", weights_only=True)
    raise ValueError(f"{folder}: a sentence-transformers Dense module without weights.")


def _load_st_projector(model_config: ModelConfig) -> nn.Module | None:
    """The sentence-transformers Dense modules after pooling (modules.json
    entries of type sentence_transformers.models.Dense), as one projector in
    the head dtype; None when there are none."""
    from vllm.transformers_utils.config import _read_json, get_st_modules

    modules = get_st_modules(model_config.model) or []
    layers: list[nn.Module] = []
    for module in modules:
        if not module.get("type", "").endswith(".Dense"):
            continue
        folder = os.path.join(model_config.model, module.get("path", ""))
        cfg = _read_json(folder, "config.json") or {}
        act_name = cfg.get("activation_function", "torch.nn.modules.linear.Identity")
        if act_name not in _ST_DENSE_ACTIVATIONS:
            raise ValueError(f"{folder}: Dense activation {act_name!r} is not built here.")
        linear = nn.Linear(
            cfg["in_features"],
            cfg["out_features"],
            bias=cfg.get("bias", True),
            dtype=model_config.head_dtype,
        )
        state = _load_dense_weights(folder)
        linear.weight.data.copy_(state["linear.weight"])
        if linear.bias is not None:
            linear.bias.data.copy_(state["linear.bias"])
        layers += [linear, _ST_DENSE_ACTIVATIONS[act_name]()]
    if not layers:
        return None
    return _STProjector(*layers)
