"""Linear layers shaped for tensor parallelism (upstream: vllm/model_executor/layers/linear.py).

Every layer stores its weight as [output_size_per_partition, input_size_per_partition]
and gives each parameter a `weight_loader(param, loaded_weight, loaded_shard_id=None)`
that copies this rank's slice of a checkpoint tensor. The tensor-parallel size
and rank come from `vllm.distributed` (one rank when no group is set up):
column-parallel layers split the output features, row-parallel ones the input
features and sum the partial products with an all-reduce.

`forward` returns `(output, output_bias)`, as upstream: `output_bias` is the bias
when `skip_bias_add=True` (the caller fuses it later), else None.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parameter import Parameter

from vllm.distributed import (
    divide,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from vllm.model_executor.layers.utils import pack_weight_for_cpu, unquantized_gemm
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.utils import set_weight_attrs


def tp_size_and_rank() -> tuple[int, int]:
    """Tensor-parallel world size and rank of this process."""
    return get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()


class LinearBase(nn.Module):
    """Holds the shared state: sizes, dtype, the weight and an optional bias."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        skip_bias_add: bool = False,
        params_dtype: torch.dtype | None = None,
        quant_config: Any = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        if quant_config is not None:
            raise NotImplementedError("Quantized linear layers are not built.")
        self.input_size = input_size
        self.output_size = output_size
        self.skip_bias_add = skip_bias_add
        self.params_dtype = params_dtype or torch.get_default_dtype()
        self.prefix = prefix
        self.tp_size, self.tp_rank = tp_size_and_rank()
        self._packed_weight: torch.Tensor | None = None  # set after loading on CPU

    def _create_weights(
        self,
        out_features: int,
        in_features: int,
        bias: bool,
        extra_attrs: dict[str, Any],
        bias_output_dim: int | None = 0,
    ) -> None:
        """The weight and bias parameters; `bias_output_dim` is None for a
        bias that is replicated rather than split over the ranks."""
        self.weight = Parameter(
            torch.empty(out_features, in_features, dtype=self.params_dtype), requires_grad=False
        )
        set_weight_attrs(self.weight, {"weight_loader": self.weight_loader, **extra_attrs})
        if bias:
            self.bias = Parameter(
                torch.empty(out_features, dtype=self.params_dtype), requires_grad=False
            )
            set_weight_attrs(
                self.bias, {"weight_loader": self.weight_loader, "output_dim": bias_output_dim}
            )
        else:
            self.register_parameter("bias", None)

    def weight_loader(
        self, param: Parameter, loaded_weight: torch.Tensor, loaded_shard_id: Any = None
    ) -> None:
        """Copy this rank's part of `loaded_weight` into `param` (per subclass)."""
        raise NotImplementedError

    def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
        """Once loaded, repack the weight for the CPU GEMM and drop the dense
        copy (its loaders are no longer needed); other devices keep it."""
        packed = pack_weight_for_cpu(self.weight)
        if packed is not None:
            self._packed_weight = packed
            self.weight = Parameter(torch.empty(0, dtype=self.weight.dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, Parameter | None]:
        """x [..., input_size] -> ([..., output_size_per_partition], bias or None)."""
        if self.skip_bias_add:
            return unquantized_gemm(x, self.weight, None, self._packed_weight), self.bias
        return unquantized_gemm(x, self.weight, self.bias, self._packed_weight), None

    def extra_repr(self) -> str:
        return (
            f"in_features={self.input_size}, output_features={self.output_size}, "
            f"bias={self.bias is not None}, tp_size={self.tp_size}"
        )


class ReplicatedLinear(LinearBase):
    """The full weight on every rank."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = True,
        skip_bias_add: bool = False,
        params_dtype: torch.dtype | None = None,
        quant_config: Any = None,
        prefix: str = "",
    ) -> None:
        super().__init__(input_size, output_size, skip_bias_add, params_dtype, quant_config, prefix)
        self._create_weights(output_size, input_size, bias, {})

    def weight_loader(
        self, param: Parameter, loaded_weight: torch.Tensor, loaded_shard_id: Any = None
    ) -> None:
        default_weight_loader(param, loaded_weight)


class ColumnParallelLinear(LinearBase):
    """Y = XA with A split along its output dim: each rank holds rows
    [rank * out/tp, (rank + 1) * out/tp) of the [out, in] weight."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = True,
        gather_output: bool = False,
        skip_bias_add: bool = False,
        params_dtype: torch.dtype | None = None,
        quant_config: Any = None,
        output_sizes: list[int] | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__(input_size, output_size, skip_bias_add, params_dtype, quant_config, prefix)
        self.gather_output = gather_output
        self.output_sizes = output_sizes or [output_size]
        self.output_size_per_partition = divide(output_size, self.tp_size)
        self._create_weights(
            self.output_size_per_partition, input_size, bias, {"output_dim": 0, "input_dim": 1}
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, Parameter | None]:
        """x [..., input_size] -> ([..., output_size_per_partition], bias or None);
        the full [..., output_size] on every rank when `gather_output`."""
        output, output_bias = super().forward(x)
        if self.gather_output and self.tp_size > 1:
            output = tensor_model_parallel_all_gather(output, dim=-1)
        return output, output_bias

    def weight_loader(
        self, param: Parameter, loaded_weight: torch.Tensor, loaded_shard_id: Any = None
    ) -> None:
        shard = param.data.shape[0]
        loaded_weight = loaded_weight.narrow(0, self.tp_rank * shard, shard)
        default_weight_loader(param, loaded_weight)

    def _copy_shard(
        self, param: Parameter, loaded_weight: torch.Tensor, offset: int, size: int, rank_index: int
    ) -> None:
        """Copy rows [rank_index * size, +size) of a checkpoint tensor into
        rows [offset, offset + size) of the fused parameter."""
        dst = param.data.narrow(0, offset, size)
        src = loaded_weight.narrow(0, rank_index * size, size)
        if dst.shape != src.shape:
            raise ValueError(
                f"Shard shape mismatch: parameter slice {tuple(dst.shape)} vs "
                f"checkpoint {tuple(src.shape)}."
            )
        dst.copy_(src)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections fused along the output dim
    (e.g. gate_up_proj = [gate_proj; up_proj]); shard ids are indices into `output_sizes`."""

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        bias: bool = True,
        gather_output: bool = False,
        skip_bias_add: bool = False,
        params_dtype: torch.dtype | None = None,
        quant_config: Any = None,
        prefix: str = "",
    ) -> None:
        super().__init__(
            input_size,
            sum(output_sizes),
            bias,
            gather_output,
            skip_bias_add,
            params_dtype,
            quant_config,
            output_sizes=list(output_sizes),
            prefix=prefix,
        )

    def weight_loader(
        self, param: Parameter, loaded_weight: torch.Tensor, loaded_shard_id: int | None = None
    ) -> None:
        if loaded_shard_id is None:  # an already fused checkpoint tensor
            return super().weight_loader(param, loaded_weight)
        if not 0 <= loaded_shard_id < len(self.output_sizes):
            raise ValueError(
                f"Shard id {loaded_shard_id} out of range for "
                f"{len(self.output_sizes)} merged outputs."
            )
        offset = sum(self.output_sizes[:loaded_shard_id]) // self.tp_size
        size = self.output_sizes[loaded_shard_id] // self.tp_size
        self._copy_shard(param, loaded_weight, offset, size, self.tp_rank)


class QKVParallelLinear(ColumnParallelLinear):
    """The fused q/k/v projection: rows are [q (num_heads*head_size);
    k (num_kv_heads*head_size); v (num_kv_heads*head_size)] of this rank.
    When tp_size > total_num_kv_heads each KV head is replicated on several ranks."""

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        total_num_heads: int,
        total_num_kv_heads: int | None = None,
        bias: bool = True,
        skip_bias_add: bool = False,
        params_dtype: torch.dtype | None = None,
        quant_config: Any = None,
        prefix: str = "",
    ) -> None:
        tp_size, _ = tp_size_and_rank()
        self.hidden_size = hidden_size
        self.head_size = head_size
        self.total_num_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads or total_num_heads
        self.num_heads = divide(total_num_heads, tp_size)
        if tp_size >= self.total_num_kv_heads:
            self.num_kv_heads = 1
            self.num_kv_head_replicas = tp_size // self.total_num_kv_heads
        else:
            self.num_kv_heads = self.total_num_kv_heads // tp_size
            self.num_kv_head_replicas = 1
        output_size = (self.num_heads + 2 * self.num_kv_heads) * tp_size * head_size
        super().__init__(
            hidden_size,
            output_size,
            bias,
            False,
            skip_bias_add,
            params_dtype,
            quant_config,
            prefix=prefix,
        )

    def _shard_offset_and_size(self, shard_id: str) -> tuple[int, int]:
        q = self.num_heads * self.head_size
        kv = self.num_kv_heads * self.head_size
        return {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}[shard_id]

    def weight_loader(
        self, param: Parameter, loaded_weight: torch.Tensor, loaded_shard_id: str | None = None
    ) -> None:
        if loaded_shard_id is None:  # an already fused checkpoint tensor
            return super().weight_loader(param, loaded_weight)
        if loaded_shard_id not in ("q", "k", "v"):
            raise ValueError(f"Unknown QKV shard id {loaded_shard_id!r}.")
        offset, size = self._shard_offset_and_size(loaded_shard_id)
        rank_index = (
            self.tp_rank if loaded_shard_id == "q" else self.tp_rank // self.num_kv_head_replicas
        )
        self._copy_shard(param, loaded_weight, offset, size, rank_index)


class RowParallelLinear(LinearBase):
    """Y = XA with A split along its input dim: each rank holds columns of the
    [out, in] weight and the partial results are summed (all-reduce) across ranks.
    The bias is added once, after the reduction."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = True,
        input_is_parallel: bool = True,
        skip_bias_add: bool = False,
        params_dtype: torch.dtype | None = None,
        reduce_results: bool = True,
        quant_config: Any = None,
        prefix: str = "",
    ) -> None:
        super().__init__(input_size, output_size, skip_bias_add, params_dtype, quant_config, prefix)
        self.input_is_parallel = input_is_parallel
        self.reduce_results = reduce_results
        self.input_size_per_partition = divide(input_size, self.tp_size)
        self._create_weights(
            output_size,
            self.input_size_per_partition,
            bias,
            {"output_dim": 0, "input_dim": 1},
            bias_output_dim=None,  # the bias is replicated, not split
        )

    def weight_loader(
        self, param: Parameter, loaded_weight: torch.Tensor, loaded_shard_id: Any = None
    ) -> None:
        if getattr(param, "input_dim", None) is not None:
            shard = param.data.shape[1]
            loaded_weight = loaded_weight.narrow(1, self.tp_rank * shard, shard)
        default_weight_loader(param, loaded_weight)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, Parameter | None]:
        """x [..., input_size_per_partition] (or the full [..., input_size] when
        not `input_is_parallel`) -> ([..., output_size], bias or None)."""
        if self.tp_size == 1:
            return super().forward(x)
        if not self.input_is_parallel:
            x = x.narrow(
                -1, self.tp_rank * self.input_size_per_partition, self.input_size_per_partition
            )
        output = unquantized_gemm(x, self.weight, None, self._packed_weight)
        if self.reduce_results:
            output = tensor_model_parallel_all_reduce(output)
        if self.skip_bias_add:
            return output, self.bias
        # The bias is counted once: after the sum, or (when the caller sums
        # later) on rank 0 only.
        if self.bias is not None and (self.reduce_results or self.tp_rank == 0):
            output = output + self.bias
        return output, None
