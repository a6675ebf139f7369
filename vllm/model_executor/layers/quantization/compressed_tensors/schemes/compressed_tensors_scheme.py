"""The interface of one compressed-tensors scheme
(upstream: .../compressed_tensors/schemes/compressed_tensors_scheme.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import nn


class CompressedTensorsScheme(ABC):
    """Creates, repacks and multiplies one layer's weights in one scheme."""

    @classmethod
    @abstractmethod
    def get_min_capability(cls) -> int:
        raise NotImplementedError

    @abstractmethod
    def create_weights(
        self,
        layer: nn.Module,
        output_partition_sizes: list[int],
        input_size_per_partition: int,
        params_dtype: torch.dtype,
        weight_loader: Any,
        **kwargs: Any,
    ) -> None:
        raise NotImplementedError

    @abstractmethod
    def apply_weights(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        raise NotImplementedError

    @abstractmethod
    def process_weights_after_loading(self, layer: nn.Module) -> None:
        raise NotImplementedError
