"""The interface of one compressed-tensors scheme
(upstream: .../compressed_tensors/schemes/compressed_tensors_scheme.py), and
the base of the two FP8 schemes, whose weights are an `Fp8WeightLayout`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import nn

from vllm.model_executor.layers.linear import LinearWeightSpec
from vllm.model_executor.layers.quantization.utils.fp8_utils import Fp8WeightLayout


class CompressedTensorsScheme(ABC):
    """Creates, repacks and multiplies one layer's weights in one scheme.
    Schemes implement `create_linear_weights` (what
    `CompressedTensorsLinearMethod` calls); `create_weights` is upstream's
    signature for the same."""

    @classmethod
    def get_min_capability(cls) -> int:
        return -1  # every scheme built here runs CPU kernels

    def create_weights(
        self,
        layer: nn.Module,
        output_partition_sizes: list[int],
        input_size_per_partition: int,
        params_dtype: torch.dtype,
        weight_loader: Any,
        **kwargs: Any,
    ) -> None:
        spec = LinearWeightSpec(
            input_size_per_partition,
            output_partition_sizes,
            getattr(layer, "input_size", input_size_per_partition),
            getattr(layer, "output_size", sum(output_partition_sizes)),
            params_dtype,
            {"weight_loader": weight_loader},
        )
        self.create_linear_weights(layer, spec)

    @abstractmethod
    def create_linear_weights(self, layer: Any, spec: LinearWeightSpec) -> None:
        """Register this rank's parameters on `layer` (`spec.weight_loader`
        loads each)."""
        raise NotImplementedError

    @abstractmethod
    def apply_weights(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        raise NotImplementedError

    @abstractmethod
    def process_weights_after_loading(self, layer: nn.Module) -> None:
        raise NotImplementedError


class CompressedTensorsFp8Scheme(Fp8WeightLayout, CompressedTensorsScheme):
    """An FP8 scheme (W8A16-FP8, W8A8-FP8): the layout creates, repacks
    (`process_weights_after_loading`) and runs the weights."""

    def create_linear_weights(self, layer: Any, spec: LinearWeightSpec) -> None:
        self.create(
            layer, spec.output_partition_sizes, spec.input_size_per_partition, spec.weight_loader
        )

    def apply_weights(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return self.apply(layer, x, bias)
