"""LoRA on column-parallel linear layers (upstream:
vllm/lora/layers/column_parallel_linear.py).

Tensor parallelism: a column layer's rank r holds rows [r * out/tp, ...) of
the output, so an adapter's B is split the same way (each slice of a packed
layer separately: gate/up halves, q/k/v with their GQA shard sizes) and A is
whole. The `...WithShardedLoRA` classes (fully_sharded_loras, S-LoRA,
arXiv:2311.03285) split A along the rank too: each rank shrinks to its
rank / tp rows, the rows are all-gathered, then expanded with this rank's B.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vllm.distributed import divide, tensor_model_parallel_all_gather
from vllm.lora.layers.base import LoRATensors
from vllm.lora.layers.base_linear import BaseLinearLayerWithLoRA
from vllm.lora.layers.utils import (
    _fully_sharded_can_replace,
    _not_fully_sharded_can_replace,
    _resolve_lora_dtype,
)
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
)

_Slices = list[torch.Tensor | None]


def _mcp_apply(x: torch.Tensor, bias: torch.Tensor | None, layer: Any) -> torch.Tensor:
    """The fully sharded column apply: shrink with this rank's A rows into
    a float32 [slices, tokens, rank / tp] buffer, gather it along the rank
    (rank order = A's row order), expand with this rank's B."""
    output = layer.base_layer.quant_method.apply(layer.base_layer, x, bias)
    shape = output.shape
    x = x.reshape(-1, x.shape[-1])
    output = output.reshape(-1, output.shape[-1])
    local_rank = layer.lora_a_stacked[0].shape[2]
    buffer = torch.zeros(
        (layer.n_slices, x.shape[0], local_rank), dtype=torch.float32, device=x.device
    )
    shrunk = layer.punica_wrapper.add_shrink(buffer, x, layer.lora_a_stacked, 1.0)
    if shrunk is not None:
        buffer = shrunk
    buffer = tensor_model_parallel_all_gather(buffer, dim=-1)
    out = layer.punica_wrapper.add_expand(
        output, buffer, layer.lora_b_stacked, layer.output_slices, offset_start=0
    )
    if out is not None:
        output = out
    return output.reshape(shape)


def _shard_rows(t: torch.Tensor | None, size: int, shard: int) -> torch.Tensor | None:
    """Rows [shard * size, (shard + 1) * size) of t (None stays None)."""
    return None if t is None else t[shard * size : (shard + 1) * size]


class ColumnParallelLinearWithLoRA(BaseLinearLayerWithLoRA):
    """LoRA on a ColumnParallelLinear, or on a MergedColumnParallelLinear
    that the adapter targets as one module (its B then has the two halves
    stacked, each split per rank). B is split for tensor parallelism."""

    base_layer: ColumnParallelLinear

    def __init__(self, base_layer: ColumnParallelLinear) -> None:
        super().__init__(base_layer)
        self.is_merged_col_linear = isinstance(base_layer, MergedColumnParallelLinear)
        self.output_size = base_layer.output_size_per_partition
        self.n_slices = 1

    def slice_lora_b(self, lora_b: Any) -> Any:
        if self.is_merged_col_linear:
            half = self.output_size // 2
            offset = lora_b.shape[0] // 2
            left = lora_b[self.tp_rank * half : (self.tp_rank + 1) * half]
            right = lora_b[offset + self.tp_rank * half : offset + (self.tp_rank + 1) * half]
            return torch.cat([left, right], dim=0)
        return lora_b[self.tp_rank * self.output_size : (self.tp_rank + 1) * self.output_size]

    def forward(self, input_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As ColumnParallelLinear.forward: (output, bias if skip_bias_add)."""
        base = self.base_layer
        bias = base.bias if not base.skip_bias_add else None
        output = self.apply(input_, bias)
        if base.gather_output and self.tp_size > 1:
            output = tensor_model_parallel_all_gather(output, dim=-1)
        return output, (base.bias if base.skip_bias_add else None)

    @classmethod
    @_not_fully_sharded_can_replace
    def can_replace_layer(
        cls,
        source_layer: nn.Module,
        lora_config: Any,
        packed_modules_list: list[str],
        model_config: Any = None,
    ) -> bool:
        if type(source_layer) is ColumnParallelLinear:
            return True
        if isinstance(source_layer, MergedColumnParallelLinear):
            # One checkpoint module for the whole layer; 3+ outputs are the
            # variable-slice class's (slice_lora_b above assumes two halves).
            return len(packed_modules_list) == 1 and len(source_layer.output_sizes) < 3
        return False


class MergedColumnParallelLinearWithLoRA(ColumnParallelLinearWithLoRA):
    """Two (or more) column projections packed into one layer (gate_proj +
    up_proj -> gate_up_proj): one LoRA per slice, each slice's B split per
    rank on its own."""

    def __init__(self, base_layer: ColumnParallelLinear) -> None:
        super().__init__(base_layer)
        self.output_sizes: list[int] = list(base_layer.output_sizes)
        self.output_slices = tuple(divide(size, self.tp_size) for size in self.output_sizes)
        self.n_slices = len(self.output_slices)
        # Which shard of each slice this rank holds.
        self.output_ids: tuple[int, ...] = (self.tp_rank,) * self.n_slices

    def create_lora_weights(
        self,
        max_loras: int,
        lora_config: Any,
        model_config: Any = None,
    ) -> None:
        self.lora_config = lora_config
        dtype = _resolve_lora_dtype(lora_config, self.base_layer)
        rank = lora_config.max_lora_rank
        a_rows = divide(rank, self.tp_size) if lora_config.fully_sharded_loras else rank
        self.lora_a_stacked = tuple(
            self._zeros(max_loras, a_rows, self.input_size, dtype) for _ in range(self.n_slices)
        )
        self.lora_b_stacked = tuple(
            self._zeros(max_loras, size, rank, dtype) for size in self.output_slices
        )

    def slice_lora_b(self, lora_b: Any) -> Any:
        return [
            _shard_rows(b, size, shard)
            for b, size, shard in zip(lora_b, self.output_slices, self.output_ids)
        ]

    def expand_packed_lora(self, lora_a: _Slices, lora_b: _Slices) -> tuple[_Slices, _Slices]:
        """Adapter groups that each cover several consecutive slices (one B
        with their rows stacked) -> one (A, B) per slice, A repeated."""
        expanded_a: _Slices = []
        expanded_b: _Slices = []
        start = 0
        for a, b in zip(lora_a, lora_b):
            if b is None:
                raise ValueError("A packed LoRA group without lora_b cannot be split.")
            rows, covered = 0, 0
            for i in range(start, self.n_slices):
                rows += self.output_sizes[i]
                if rows == b.shape[0]:
                    covered = i - start + 1
                    break
            else:
                raise ValueError(
                    f"Cannot determine how to split lora_b with {b.shape[0]} rows into "
                    f"{self.n_slices} slices with output sizes {self.output_sizes} "
                    f"starting from index {start}."
                )
            row = 0
            for j in range(covered):
                size = self.output_sizes[start + j]
                expanded_b.append(b[row : row + size])
                expanded_a.append(a)
                row += size
            start += covered
        return expanded_a, expanded_b

    def set_lora(self, index: int, lora_a: LoRATensors, lora_b: LoRATensors) -> None:
        """lora_a / lora_b: one entry per slice, None where the adapter does
        not target that slice (it then adds nothing there)."""
        assert isinstance(lora_a, list) and isinstance(lora_b, list)
        self.reset_lora(index)
        if len(lora_b) != self.n_slices:
            lora_a, lora_b = self.expand_packed_lora(lora_a, lora_b)
        if self.tp_size > 1:
            lora_a = self.slice_lora_a(lora_a)
            lora_b = self.slice_lora_b(lora_b)
        for s in range(self.n_slices):
            self._copy_into_slot(index, s, lora_a[s], lora_b[s])

    @classmethod
    def can_replace_layer(
        cls,
        source_layer: nn.Module,
        lora_config: Any,
        packed_modules_list: list[str],
        model_config: Any = None,
        decorate: bool = True,
    ) -> bool:
        if type(source_layer) is not MergedColumnParallelLinear:
            return False
        if len(packed_modules_list) != 2:
            return False
        return not decorate or not lora_config.fully_sharded_loras or source_layer.tp_size == 1


class QKVParallelLinearWithLoRA(ColumnParallelLinearWithLoRA):
    """A qkv_proj the adapter targets as one module (models whose checkpoint
    has a fused qkv): one LoRA, its B rows [q; k; v] split per rank along
    each part (q by head shard, k / v by KV-head shard)."""

    def __init__(self, base_layer: QKVParallelLinear) -> None:
        super().__init__(base_layer)
        self.q_proj_total_size = base_layer.total_num_heads * base_layer.head_size
        self.q_proj_shard_size = base_layer.num_heads * base_layer.head_size
        self.kv_proj_shard_size = base_layer.num_kv_heads * base_layer.head_size
        self.kv_proj_total_size = base_layer.total_num_kv_heads * base_layer.head_size
        self.q_shard_id = self.tp_rank
        self.kv_shard_id = self.tp_rank // base_layer.num_kv_head_replicas
        self.n_slices = 1

    def slice_lora_b(self, lora_b: Any) -> Any:
        q = lora_b[: self.q_proj_total_size]
        k = lora_b[self.q_proj_total_size : self.q_proj_total_size + self.kv_proj_total_size]
        v = lora_b[self.q_proj_total_size + self.kv_proj_total_size :]
        parts = [
            _shard_rows(q, self.q_proj_shard_size, self.q_shard_id),
            _shard_rows(k, self.kv_proj_shard_size, self.kv_shard_id),
            _shard_rows(v, self.kv_proj_shard_size, self.kv_shard_id),
        ]
        return torch.cat([p for p in parts if p is not None], dim=0)

    @classmethod
    @_not_fully_sharded_can_replace
    def can_replace_layer(
        cls,
        source_layer: nn.Module,
        lora_config: Any,
        packed_modules_list: list[str],
        model_config: Any = None,
    ) -> bool:
        return type(source_layer) is QKVParallelLinear and len(packed_modules_list) == 1


class MergedQKVParallelLinearWithLoRA(MergedColumnParallelLinearWithLoRA):
    """qkv_proj packed from q_proj, k_proj, v_proj: three LoRAs, q's slice
    num_heads * head_size rows and k's / v's num_kv_heads * head_size (GQA)
    on this rank."""

    def __init__(self, base_layer: QKVParallelLinear) -> None:
        super().__init__(base_layer)
        head = base_layer.head_size
        self.q_proj_shard_size = base_layer.num_heads * head
        self.kv_proj_shard_size = base_layer.num_kv_heads * head
        self.q_shard_id = self.tp_rank
        self.kv_shard_id = self.tp_rank // base_layer.num_kv_head_replicas
        # Full (unsharded) sizes, for adapter groups spanning several slices.
        self.output_sizes = [
            base_layer.total_num_heads * head,
            base_layer.total_num_kv_heads * head,
            base_layer.total_num_kv_heads * head,
        ]
        self.output_slices = (
            self.q_proj_shard_size,
            self.kv_proj_shard_size,
            self.kv_proj_shard_size,
        )
        self.output_ids = (self.q_shard_id, self.kv_shard_id, self.kv_shard_id)
        self.n_slices = 3

    @classmethod
    @_not_fully_sharded_can_replace
    def can_replace_layer(
        cls,
        source_layer: nn.Module,
        lora_config: Any,
        packed_modules_list: list[str],
        model_config: Any = None,
    ) -> bool:
        return type(source_layer) is QKVParallelLinear and len(packed_modules_list) == 3


class MergedColumnParallelLinearVariableSliceWithLoRA(MergedColumnParallelLinearWithLoRA):
    """A MergedColumnParallelLinear of 3+ outputs; an adapter may target it
    as one module (one A for all slices, B split by output_sizes)."""

    def set_lora(self, index: int, lora_a: LoRATensors, lora_b: LoRATensors) -> None:
        if isinstance(lora_a, torch.Tensor):
            lora_a = [lora_a] * self.n_slices
        if isinstance(lora_b, torch.Tensor):
            bounds = [0]
            for size in self.output_sizes:
                bounds.append(bounds[-1] + size)
            lora_b = [lora_b[lo:hi] for lo, hi in zip(bounds, bounds[1:])]
        super().set_lora(index, lora_a, lora_b)

    @classmethod
    @_not_fully_sharded_can_replace
    def can_replace_layer(
        cls,
        source_layer: nn.Module,
        lora_config: Any,
        packed_modules_list: list[str],
        model_config: Any = None,
    ) -> bool:
        if not isinstance(source_layer, MergedColumnParallelLinear):
            return False
        if len(packed_modules_list) >= 3:
            return True
        if len(packed_modules_list) == 2:
            return False
        return len(source_layer.output_sizes) >= 3


# Fully sharded variants (fully_sharded_loras=True): A split along the rank.


def _slice_a_rows(layer: Any, lora_a: torch.Tensor | None) -> torch.Tensor | None:
    """This rank's rows of A: [tp_rank * r/tp, (tp_rank + 1) * r/tp) of the
    max_lora_rank rows (fewer, or none, for an adapter of smaller rank)."""
    return _shard_rows(lora_a, layer.lora_a_stacked[0].shape[2], layer.tp_rank)


class _ShardedColumnLoRA:
    """What the four fully sharded column classes share: the S-LoRA apply
    (`_mcp_apply`) and `can_replace_layer` = the non-sharded parent's rule with
    fully_sharded_loras on. Listed before that parent in the bases."""

    def apply(  # upstream's name (nn.Module.apply differs)
        self, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return _mcp_apply(x, bias, self)

    @classmethod
    @_fully_sharded_can_replace
    def can_replace_layer(cls, source_layer: nn.Module, lora_config: Any, **kwargs: Any) -> bool:
        parent: Any = super()  # the non-sharded class next in the MRO
        return bool(
            parent.can_replace_layer(
                source_layer=source_layer, lora_config=lora_config, decorate=False, **kwargs
            )
        )


# ignore[misc]: _ShardedColumnLoRA.apply is upstream's apply, not nn.Module.apply.
class ColumnParallelLinearWithShardedLoRA(_ShardedColumnLoRA, ColumnParallelLinearWithLoRA):  # type: ignore[misc]
    """ColumnParallelLinearWithLoRA with A split along the rank."""

    def slice_lora_a(self, lora_a: Any) -> Any:
        return _slice_a_rows(self, lora_a)


# ignore[misc]: _ShardedColumnLoRA.apply is upstream's apply, not nn.Module.apply.
class MergedColumnParallelLinearWithShardedLoRA(  # type: ignore[misc]
    _ShardedColumnLoRA, MergedColumnParallelLinearWithLoRA
):
    """MergedColumnParallelLinearWithLoRA with each slice's A split along the rank."""

    def slice_lora_a(self, lora_a: Any) -> Any:
        return [_slice_a_rows(self, a) for a in lora_a]


# ignore[misc]: _ShardedColumnLoRA.apply is upstream's apply, not nn.Module.apply.
class QKVParallelLinearWithShardedLoRA(_ShardedColumnLoRA, QKVParallelLinearWithLoRA):  # type: ignore[misc]
    """QKVParallelLinearWithLoRA with A split along the rank."""

    def slice_lora_a(self, lora_a: Any) -> Any:
        return _slice_a_rows(self, lora_a)


# ignore[misc]: _ShardedColumnLoRA.apply is upstream's apply, not nn.Module.apply.
class MergedQKVParallelLinearWithShardedLoRA(_ShardedColumnLoRA, MergedQKVParallelLinearWithLoRA):  # type: ignore[misc]
    """MergedQKVParallelLinearWithLoRA with each slice's A split along the rank."""

    def slice_lora_a(self, lora_a: Any) -> Any:
        return [_slice_a_rows(self, a) for a in lora_a]
