"""LoRA on a ReplicatedLinear (upstream: vllm/lora/layers/replicated_linear.py).

The base layer is whole on every rank, so are the adapter's A and B; it is
wrapped whatever fully_sharded_loras says.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vllm.lora.layers.base_linear import BaseLinearLayerWithLoRA
from vllm.model_executor.layers.linear import ReplicatedLinear


class ReplicatedLinearWithLoRA(BaseLinearLayerWithLoRA):
    def __init__(self, base_layer: ReplicatedLinear) -> None:
        super().__init__(base_layer)
        self.output_size = base_layer.output_size
        self.n_slices = 1

    def forward(self, input_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As ReplicatedLinear.forward: (output, bias if skip_bias_add)."""
        return self.apply(input_), (self.base_layer.bias if self.base_layer.skip_bias_add else None)

    def apply(  # type: ignore[override]  # upstream's name (nn.Module.apply differs)
        self, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        # The base layer's own forward (a subclass may override it; it
        # handles its bias), then the LoRA delta on its output.
        output = self.base_layer(x)
        output = output[0] if isinstance(output, tuple) else output
        return self._apply_lora_to_output(x, output)

    @classmethod
    def can_replace_layer(
        cls,
        source_layer: nn.Module,
        lora_config: Any,
        packed_modules_list: list[str],
        model_config: Any = None,
    ) -> bool:
        return isinstance(source_layer, ReplicatedLinear)
