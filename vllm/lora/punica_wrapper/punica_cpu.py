"""Punica wrapper over the PyTorch ops (upstream:
vllm/lora/punica_wrapper/punica_cpu.py).

Upstream's CPU wrapper re-derives the token grouping inside every op call
(sgmv for prefill steps, bgmv for decode). Here `update_metadata` builds one
`LoRAPlan` per step (vllm/lora/ops/torch_ops/lora_plan.py: contiguous runs,
per-slot rows, or the dense masked form for decode-like batches) and every
layer's shrink / expand reuses it; prefill and decode steps share the code.

The dense plan multiplies by B laid out `[slots * rank, out]` (and, for
multi-slice layers, by all slices' A stacked); those copies are cached per
weight tensor and rebuilt when the slot table
(`lora_index_to_id`) changes or the tensor was written in place (its version
counter, where it has one: inference-mode tensors keep none).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from vllm.lora.ops.torch_ops.lora_plan import (
    LoRAPlan,
    make_plan,
    plan_expand,
    plan_linear,
    plan_shrink,
    stacked_b_t,
)
from vllm.lora.punica_wrapper.punica_base import PunicaWrapperBase

if TYPE_CHECKING:
    from vllm.lora.layers.utils import LoRAMapping


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # inference tensors have no version counter
        return None


class PunicaWrapperCPU(PunicaWrapperBase):
    """Multi-LoRA on CPU (and any platform the PyTorch ops run on)."""

    def __init__(
        self,
        max_num_batched_tokens: int,
        max_batches: int,
        device: torch.device | str,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_num_batched_tokens, max_batches, device, **kwargs)
        self._plan = LoRAPlan(0)
        self._sampler_plan: LoRAPlan | None = None
        self._slot_table: tuple[int | None, ...] | None = None
        # ids of weight tensors -> (the tensors, their versions, a derived copy).
        self._cache: dict[tuple, tuple[tuple[torch.Tensor, ...], tuple, Any]]
        self._cache = {}

    def update_metadata(
        self,
        mapping: LoRAMapping,
        lora_index_to_id: list[int | None],
        max_loras: int,
        vocab_size: int,
        **kwargs: Any,
    ) -> None:
        super().update_metadata(mapping, lora_index_to_id, max_loras, vocab_size, **kwargs)
        self._plan = make_plan(self.token_lora_indices)
        self._sampler_plan = None
        table = tuple(lora_index_to_id)
        if table != self._slot_table:  # slot contents changed
            self._cache.clear()
            self._slot_table = table

    @property
    def plan(self) -> LoRAPlan:
        """This step's token plan (see lora_plan.py)."""
        return self._plan

    def _derived(
        self, tensors: tuple[torch.Tensor, ...], build: Callable[[], Any], tag: str = ""
    ) -> Any:
        """`build()` (derived from `tensors`: a re-laid-out copy, a flag),
        cached until the slot table changes or a tensor is written in place."""
        key = (tag, *(id(t) for t in tensors))
        versions = tuple(_version(t) for t in tensors)
        hit = self._cache.get(key)
        if hit is not None and all(h is t for h, t in zip(hit[0], tensors)) and hit[1] == versions:
            return hit[2]
        value = build()
        self._cache[key] = (tensors, versions, value)  # holds the tensors: ids stay unique
        return value

    def _b_t(self, b: torch.Tensor, plan: LoRAPlan) -> torch.Tensor | None:
        """B as `[slots * rank, out]` for a dense plan (cached), else None."""
        return self._derived((b,), lambda: stacked_b_t(b), "b_t") if plan.dense else None

    def _no_weights(self, b: torch.Tensor) -> bool:
        """True when a B stack is zero in every slot (a module none of the
        loaded adapters targets, e.g. the LM head): its delta is exactly 0,
        so the op is skipped. Cached like the layouts."""
        return bool(self._derived((b,), lambda: not bool(b.any()), "zero"))

    def _a_cat(self, a_stacked: tuple[torch.Tensor, ...], plan: LoRAPlan) -> torch.Tensor | None:
        """Every slice's A of every slot as one `[slices * slots * rank, in]`
        matrix (cached), for a dense plan spanning all slots of a layer with
        several slices (merged QKV, gate_up): one shrink matmul for all."""
        if not plan.dense or len(a_stacked) < 2 or plan.hi - plan.lo != a_stacked[0].size(0):
            return None
        if len({(a.shape, a.dtype) for a in a_stacked}) != 1:
            return None
        return self._derived(
            a_stacked, lambda: torch.cat([a.reshape(-1, a.size(-1)) for a in a_stacked]), "a_cat"
        )

    def add_shrink(
        self,
        y: tuple[torch.Tensor, ...] | torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: tuple[torch.Tensor, ...],
        scale: float,
        **kwargs: Any,
    ) -> None:
        """`y[i][t] = scale * x[t] @ lora_a_stacked[i][slot(t)].T` per slice."""
        x = x.reshape(-1, x.size(-1))
        for i, w in enumerate(lora_a_stacked):
            out = y[i]
            plan_shrink(self._plan, x, w, out.view(-1, out.size(-1)), scale)

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
            size = output_slices[i]
            if w.size(-2) != size:
                raise ValueError(f"slice_size {size} != lora_b output size {w.size(-2)}")
            if not (add_inputs and self._no_weights(w)):
                window = y2[:, offset : offset + size]
                plan_expand(self._plan, x[i], w, window, add_inputs, self._b_t(w, self._plan))
            offset += size

    def add_lora_embedding(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_b_stacked: torch.Tensor,
        add_inputs: bool = True,
        **kwargs: Any,
    ) -> None:
        """`y[t] += x[t] @ lora_b_stacked[slot(t)].T` (embedding: expand only)
        over the columns both have."""
        if add_inputs and self._no_weights(lora_b_stacked):
            return
        y2 = y.view(-1, y.size(-1))
        common = min(lora_b_stacked.size(-2), y2.size(1))
        b_t = self._b_t(lora_b_stacked, self._plan)
        plan_expand(self._plan, x, lora_b_stacked, y2[:, :common], add_inputs, b_t)

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
        """y += scale * (x @ A_i.T) @ B_i.T, slice i into its output columns.
        The rank-sized intermediate is kept in the weights' dtype (the
        Triton expand also rounds it to that dtype); `buffer` is not needed."""
        if not len(lora_a_stacked) == len(lora_b_stacked) == len(output_slices):
            raise ValueError("lora_a_stacked, lora_b_stacked, output_slices differ in length")
        x = x.reshape(-1, x.size(-1))
        if not kwargs.pop("add_inputs", True):  # overwrite: the shrink + expand path
            rank = lora_a_stacked[0].size(-2)
            tmp = [x.new_empty(x.size(0), rank, dtype=torch.float32) for _ in output_slices]
            self.add_shrink(tuple(tmp), x, lora_a_stacked, scale)
            self.add_expand(y, tuple(tmp), lora_b_stacked, output_slices, add_inputs=False)
            return
        if all(self._no_weights(b) for b in lora_b_stacked):
            return
        plan = self._plan
        b_t = tuple(self._b_t(b, plan) for b in lora_b_stacked)
        a_cat = self._a_cat(lora_a_stacked, plan)
        y2 = y.view(-1, y.size(-1))
        plan_linear(plan, y2, x, lora_a_stacked, lora_b_stacked, b_t, scale, output_slices, a_cat)

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
        """Logits LoRA keyed by the sampled rows' slots (`sampler_indices`)."""
        if self._no_weights(lora_b_stacked):
            return
        if self._sampler_plan is None:
            self._sampler_plan = make_plan(self.sampler_indices)
        plan = self._sampler_plan
        y2 = y.view(-1, y.size(-1))
        x = x.reshape(-1, x.size(-1))
        b_t = self._b_t(lora_b_stacked, plan)
        cols = min(lora_b_stacked.size(-2), y2.size(1))
        plan_linear(plan, y2, x, (lora_a_stacked,), (lora_b_stacked,), (b_t,), scale, (cols,))
