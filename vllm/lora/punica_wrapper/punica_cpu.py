"""Punica wrapper over the PyTorch ops (upstream:
vllm/lora/punica_wrapper/punica_cpu.py). Prefill steps use the sgmv ops
(segment metadata), decode steps the bgmv ops (per-token slots); both are
grouped by adapter (see vllm/lora/ops/torch_ops/lora_ops.py)."""

from __future__ import annotations

from typing import Any

import torch

from vllm.lora.ops.torch_ops import (
    bgmv_expand,
    bgmv_expand_slice,
    bgmv_shrink,
    sgmv_expand,
    sgmv_expand_slice,
    sgmv_shrink,
)
from vllm.lora.punica_wrapper.punica_base import PunicaWrapperBase


class PunicaWrapperCPU(PunicaWrapperBase):
    """Multi-LoRA on CPU (and any platform the PyTorch ops run on)."""

    def _shrink(self, y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, scale: float) -> None:
        if not self.is_prefill:
            bgmv_shrink(x, w, y, self.token_lora_indices, scale)
        elif self.no_lora:
            y[: x.size(0), : w.size(-2)].zero_()
        else:
            sgmv_shrink(x, w, y, *self.prefill_metadata, scale)

    def _expand(self, y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, add_inputs: bool) -> None:
        if not self.is_prefill:
            bgmv_expand(x, w, y, self.token_lora_indices, add_inputs)
        elif not self.no_lora:
            sgmv_expand(x, w, y, *self.prefill_metadata, add_inputs)

    def _expand_slice(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        w: torch.Tensor,
        y_offset: int,
        y_slice_size: int,
        add_inputs: bool,
    ) -> None:
        if not self.is_prefill:
            bgmv_expand_slice(x, w, y, self.token_lora_indices, y_offset, y_slice_size, add_inputs)
        elif not self.no_lora:
            sgmv_expand_slice(x, w, y, *self.prefill_metadata, y_offset, y_slice_size, add_inputs)

    def add_shrink(
        self,
        y: tuple[torch.Tensor, ...] | torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: tuple[torch.Tensor, ...],
        scale: float,
        **kwargs: Any,
    ) -> None:
        """`y[i][t] = scale * x[t] @ lora_a_stacked[i][slot(t)].T` per slice."""
        x = x.view(-1, x.size(-1))
        for i, w in enumerate(lora_a_stacked):
            out = y[i]
            self._shrink(out.view(-1, out.size(-1)), x, w, scale)

    def add_expand(
        self,
        y: torch.Tensor,
        x: tuple[torch.Tensor, ...] | torch.Tensor,
        lora_b_stacked: tuple[torch.Tensor, ...],
        output_slices: tuple[int, ...],
        offset_start: int = 0,
        add_inputs: bool = True,
        **kwargs: Any,
    ) -> None:
        """Slice i adds `x[i] @ B_i.T` into `y[:, off_i:off_i+output_slices[i]]`."""
        y2 = y.view(-1, y.size(-1))
        offset = offset_start
        for i, w in enumerate(lora_b_stacked):
            self._expand_slice(y2, x[i], w, offset, output_slices[i], add_inputs)
            offset += output_slices[i]

    def add_lora_embedding(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_b_stacked: torch.Tensor,
        add_inputs: bool = True,
        **kwargs: Any,
    ) -> None:
        """`y[t] += x[t] @ lora_b_stacked[slot(t)].T` (embedding: expand only)."""
        self._expand(y, x, lora_b_stacked, add_inputs)

    def add_lora_linear(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: tuple[torch.Tensor, ...],
        lora_b_stacked: tuple[torch.Tensor, ...],
        scale: float,
        output_slices: tuple[int, ...],
        *,
        buffer: tuple[torch.Tensor, ...] | None = None,
        **kwargs: Any,
    ) -> None:
        """y += scale * (x @ A_i.T) @ B_i.T, slice i into its output columns;
        the rank-sized intermediate is float32 (as the Triton op)."""
        if not len(lora_a_stacked) == len(lora_b_stacked) == len(output_slices):
            raise ValueError("lora_a_stacked, lora_b_stacked, output_slices differ in length")
        x = x.view(-1, x.size(-1))
        if buffer is None:
            rank = lora_b_stacked[0].size(-1)
            buffer = tuple(
                torch.zeros((x.size(0), rank), dtype=torch.float32, device=x.device)
                for _ in output_slices
            )
        self.add_shrink(buffer, x, lora_a_stacked, scale)
        add_inputs = kwargs.pop("add_inputs", True)
        self.add_expand(y, buffer, lora_b_stacked, output_slices, add_inputs=add_inputs)

    def add_lora_logits(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: torch.Tensor,
        lora_b_stacked: torch.Tensor,
        scale: float,
        *,
        buffer: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> None:
        """Logits LoRA keyed by the sampled rows' slots (always bgmv)."""
        y2 = y.view(-1, y.size(-1))
        x = x.view(-1, x.size(-1))
        if buffer is None:
            rank = lora_b_stacked.size(-1)
            buffer = torch.zeros((x.size(0), rank), dtype=torch.float32, device=x.device)
        bgmv_shrink(x, lora_a_stacked, buffer, self.sampler_indices, scale)
        bgmv_expand(buffer, lora_b_stacked, y2, self.sampler_indices, add_inputs=True)
