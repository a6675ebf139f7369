"""The shared part of the linear LoRA layers (upstream:
vllm/lora/layers/base_linear.py).

Stacked slots per output slice s (one slice, or 2-3 for packed layers):
  lora_a_stacked[s]: [max_loras, 1, a_rows, input_size]   (a_rows = max_lora_rank,
                     or max_lora_rank / tp for fully sharded column layers)
  lora_b_stacked[s]: [max_loras, 1, out_s, max_lora_rank] (out_s = this rank's
                     rows of slice s)
in `lora_config.lora_dtype`. A token with slot i gets
`x @ A_s[i].T @ B_s[i].T` added to its slice-s output columns. The adapter's
scaling is not applied here: the model manager folds it into B
(`LoRALayerWeights.optimize()`) before `set_lora`, so every op runs with
scale 1.0.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm.distributed import divide
from vllm.lora.layers.base import BaseLayerWithLoRA, LoRATensors
from vllm.lora.layers.utils import _get_lora_device, _resolve_lora_dtype
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    LinearBase,
    ReplicatedLinear,
    RowParallelLinear,
)


class BaseLinearLayerWithLoRA(BaseLayerWithLoRA):
    """Linear layer + LoRA; subclasses set `output_size` (this rank's
    columns), `n_slices` and, for packed layers, `output_slices`."""

    base_layer: LinearBase

    def __init__(self, base_layer: LinearBase) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.input_size = base_layer.input_size
        # The same tensor-parallel layout as the base layer.
        self.tp_size = base_layer.tp_size
        self.tp_rank = base_layer.tp_rank
        self.device = _get_lora_device(base_layer)
        self.output_slices: tuple[int, ...]
        self.output_size: int
        self.n_slices: int

    def _stacked_sizes(self, lora_config: Any) -> tuple[int, int]:
        """(rows of each A slot, rows of each B slot) of a one-slice layer."""
        rank = lora_config.max_lora_rank
        sharded = lora_config.fully_sharded_loras
        if isinstance(self.base_layer, ReplicatedLinear):
            return rank, self.output_size
        if isinstance(self.base_layer, ColumnParallelLinear):
            return (divide(rank, self.tp_size) if sharded else rank), self.output_size
        if isinstance(self.base_layer, RowParallelLinear):
            return rank, (divide(self.output_size, self.tp_size) if sharded else self.output_size)
        raise NotImplementedError(f"LoRA for {type(self.base_layer).__name__}")

    def _zeros(self, max_loras: int, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(max_loras, 1, rows, cols, dtype=dtype, device=self.device)

    def create_lora_weights(
        self,
        max_loras: int,
        lora_config: Any,
        model_config: Any = None,
    ) -> None:
        self.lora_config = lora_config
        dtype = _resolve_lora_dtype(lora_config, self.base_layer)
        a_rows, b_rows = self._stacked_sizes(lora_config)
        rank = lora_config.max_lora_rank
        self.lora_a_stacked = tuple(
            self._zeros(max_loras, a_rows, self.input_size, dtype) for _ in range(self.n_slices)
        )
        self.lora_b_stacked = tuple(
            self._zeros(max_loras, b_rows, rank, dtype) for _ in range(self.n_slices)
        )
        self.output_slices = (self.lora_b_stacked[0].shape[2],)

    def reset_lora(self, index: int) -> None:
        for s in range(self.n_slices):
            self.lora_a_stacked[s][index] = 0
            self.lora_b_stacked[s][index] = 0

    def _copy_into_slot(
        self, index: int, s: int, a: torch.Tensor | None, b: torch.Tensor | None
    ) -> None:
        """Slice s of slot `index` = (a, b), zero-padded (the slot was reset)."""
        if a is not None:
            _check_fits(a, self.lora_a_stacked[s][index, 0], "lora_a", self)
            self.lora_a_stacked[s][index, 0, : a.shape[0], : a.shape[1]].copy_(a)
        if b is not None:
            _check_fits(b, self.lora_b_stacked[s][index, 0], "lora_b", self)
            self.lora_b_stacked[s][index, 0, : b.shape[0], : b.shape[1]].copy_(b)

    def set_lora(self, index: int, lora_a: LoRATensors, lora_b: LoRATensors) -> None:
        # One-slice layers; the packed ones override this.
        assert isinstance(lora_a, torch.Tensor) and isinstance(lora_b, torch.Tensor)
        assert len(self.lora_a_stacked) == len(self.lora_b_stacked) == self.n_slices == 1
        self.reset_lora(index)
        if self.tp_size > 1:
            lora_a = self.slice_lora_a(lora_a)
            lora_b = self.slice_lora_b(lora_b)
        self._copy_into_slot(index, 0, lora_a, lora_b)  # type: ignore[arg-type]

    def apply(  # type: ignore[override]  # upstream's name (nn.Module.apply differs)
        self, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """This rank's base output (bias included when given) plus each
        token's LoRA delta."""
        output = self.base_layer.quant_method.apply(self.base_layer, x, bias)
        return self._apply_lora_to_output(x, output)

    def _apply_lora_to_output(self, x: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        # The wrapper works on [tokens, features]; a [batch, seq, features]
        # input (the transformers backend) is flattened and restored.
        shape = output.shape
        if x.ndim == 3 and output.ndim == 3:
            x, output = x.flatten(0, 1), output.flatten(0, 1)
        out = self.punica_wrapper.add_lora_linear(
            output, x, self.lora_a_stacked, self.lora_b_stacked, 1.0, self.output_slices
        )
        if out is not None:  # a wrapper that cannot update in place returns y
            output = out
        return output.reshape(shape)

    @property
    def weight(self) -> torch.Tensor:
        for name in ("weight", "weight_packed", "qweight"):
            tensor = getattr(self.base_layer, name, None)
            if isinstance(tensor, torch.Tensor):
                return tensor
        raise ValueError(f"Unsupported base layer: {self.base_layer}")

    @property
    def bias(self) -> torch.Tensor | None:
        return getattr(self.base_layer, "bias", None)


def _check_fits(t: torch.Tensor, slot: torch.Tensor, what: str, layer: object) -> None:
    """An adapter tensor that is not this layer's (rank above max_lora_rank,
    or a feature size that differs) is refused by name, not silently cut.
    A is [rank, in]: rank <= the slot's, in equal; B is [out, rank]: out
    equal, rank <= the slot's."""
    if what == "lora_a":
        fits = t.dim() == 2 and t.shape[0] <= slot.shape[0] and t.shape[1] == slot.shape[1]
    else:
        fits = t.dim() == 2 and t.shape[0] == slot.shape[0] and t.shape[1] <= slot.shape[1]
    if not fits:
        raise ValueError(
            f"{type(layer).__name__}: {what} of shape {tuple(t.shape)} does not fit the "
            f"LoRA slot {tuple(slot.shape)}."
        )
