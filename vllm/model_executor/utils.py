"""Helpers shared by the layers and the model loader (upstream: vllm/model_executor/utils.py)."""

from __future__ import annotations

from typing import Any

import torch


def set_weight_attrs(weight: torch.Tensor, weight_attrs: dict[str, Any] | None) -> None:
    """Attach loader metadata (e.g. `weight_loader`, `output_dim`) to a parameter.

    The loaders read them back with getattr: a parameter's own `weight_loader`
    copies this rank's part of a checkpoint tensor into it."""
    for key, value in (weight_attrs or {}).items():
        if hasattr(weight, key):
            raise AttributeError(f"Overwriting existing tensor attribute: {key}")
        setattr(weight, key, value)
