"""LoRA on row-parallel linear layers (upstream:
vllm/lora/layers/row_parallel_linear.py).

Tensor parallelism: rank r holds input columns [r * in/tp, ...) and the
ranks' partial outputs are summed by an all-reduce. The adapter's A is split
the same way (columns) and B is whole: each rank adds
`x_r @ A_r.T @ B.T` to its partial output before the all-reduce, and since
the expand is linear the sum over ranks is exactly `x @ A.T @ B.T`.
RowParallelLinearWithShardedLoRA (fully_sharded_loras) also splits B along
its output rows: the shrunk rows are all-reduced first, and each rank adds
only its block of output columns to the partial sum.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vllm.distributed import tensor_model_parallel_all_reduce
from vllm.lora.layers.base_linear import BaseLinearLayerWithLoRA
from vllm.lora.layers.utils import _fully_sharded_can_replace, _not_fully_sharded_can_replace
from vllm.model_executor.layers.linear import RowParallelLinear


class RowParallelLinearWithLoRA(BaseLinearLayerWithLoRA):
    """LoRA on a RowParallelLinear (o_proj, down_proj)."""

    base_layer: RowParallelLinear

    def __init__(self, base_layer: RowParallelLinear) -> None:
        super().__init__(base_layer)
        # A's columns are this rank's input features.
        self.input_size = base_layer.input_size_per_partition
        self.output_size = base_layer.output_size
        self.n_slices = 1

    def slice_lora_a(self, lora_a: Any) -> Any:
        lo = self.tp_rank * self.input_size
        return lora_a[:, lo : lo + self.input_size]

    def forward(self, input_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As RowParallelLinear.forward (the LoRA delta joins each rank's
        partial sum, before the all-reduce): (output, bias if skip_bias_add)."""
        base = self.base_layer
        if self.tp_size == 1:
            bias = None if base.skip_bias_add else base.bias
            return self.apply(input_, bias), (base.bias if base.skip_bias_add else None)
        x = input_
        if not base.input_is_parallel:
            x = x.narrow(-1, self.tp_rank * self.input_size, self.input_size)
        output = self.apply(x, None)
        if base.reduce_results:
            output = tensor_model_parallel_all_reduce(output)
        if base.skip_bias_add:
            return output, base.bias
        # The bias counted once, as the base layer does.
        if base.bias is not None and (base.reduce_results or self.tp_rank == 0):
            output = output + base.bias
        return output, None

    @classmethod
    @_not_fully_sharded_can_replace
    def can_replace_layer(
        cls,
        source_layer: nn.Module,
        lora_config: Any,
        packed_modules_list: list[str],
        model_config: Any = None,
    ) -> bool:
        return type(source_layer) is RowParallelLinear


class RowParallelLinearWithShardedLoRA(RowParallelLinearWithLoRA):
    """RowParallelLinearWithLoRA with B split along its output rows
    (S-LoRA, arXiv:2311.03285)."""

    def slice_lora_b(self, lora_b: Any) -> Any:
        rows = self.lora_b_stacked[0].shape[2]
        return lora_b[self.tp_rank * rows : (self.tp_rank + 1) * rows]

    def apply(  # type: ignore[override]  # upstream's name (nn.Module.apply differs)
        self, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        output = self.base_layer.quant_method.apply(self.base_layer, x, bias)
        shape = output.shape
        x = x.reshape(-1, x.shape[-1])
        output = output.reshape(-1, output.shape[-1])
        # [1, tokens, rank] float32: this rank's partial x_r @ A_r.T, summed
        # over the ranks into the full shrink.
        buffer = torch.zeros(
            (self.n_slices, x.shape[0], self.lora_a_stacked[0].shape[2]),
            dtype=torch.float32,
            device=x.device,
        )
        shrunk = self.punica_wrapper.add_shrink(buffer, x, self.lora_a_stacked, 1.0)
        if shrunk is not None:
            buffer = shrunk
        if self.tp_size > 1:
            buffer = tensor_model_parallel_all_reduce(buffer)
        # Only this rank's block of output columns: the other ranks add
        # theirs, and the all-reduce after sums the blocks side by side.
        offset = self.tp_rank * self.lora_b_stacked[0].shape[2]
        out = self.punica_wrapper.add_expand(
            output, buffer, self.lora_b_stacked, self.output_slices, offset_start=offset
        )
        if out is not None:
            output = out
        return output.reshape(shape)

    @classmethod
    @_fully_sharded_can_replace
    def can_replace_layer(cls, source_layer: nn.Module, lora_config: Any, **kwargs: Any) -> bool:
        return RowParallelLinearWithLoRA.can_replace_layer(
            source_layer=source_layer, lora_config=lora_config, decorate=False, **kwargs
        )
