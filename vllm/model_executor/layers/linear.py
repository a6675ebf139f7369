"""Linear layers shaped for tensor parallelism (upstream: vllm/model_executor/layers/linear.py).

A dense weight is [output_size_per_partition, input_size_per_partition]; every
parameter gets a `weight_loader(param, loaded_weight, loaded_shard_id=None)` that
copies this rank's slice of a checkpoint tensor, along the dims the parameter's
attributes name, as upstream: `output_dim` / `input_dim` (None: not split),
`packed_dim` / `pack_factor` (int4 values packed 8 per int32 along that dim;
GPTQ / AWQ tensors are [in, out]-major, so their dims differ from a dense one).
The tensor-parallel size and rank come from `vllm.distributed` (one rank when no group is set up):
column-parallel layers split the output features, row-parallel ones the input
features and sum the partial products with an all-reduce.

`forward` returns `(output, output_bias)`, as upstream: `output_bias` is the bias
when `skip_bias_add=True` (the caller fuses it later), else None.

The weight itself belongs to the layer's `quant_method` (a `LinearMethodBase`):
`UnquantizedLinearMethod` (a dense `weight`), or the method the model's
`QuantizationConfig` picks for the layer, which registers the checkpoint's
quantized tensors (e.g. `weight_packed`, `weight_scale`) with the same
`output_dim` / `input_dim` attributes, so the loaders below shard them too.
"""

from __future__ import annotations

from dataclasses import dataclass
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
from vllm.model_executor.layers.quantization.base_config import (
    QuantizationConfig,
    QuantizeMethodBase,
)
from vllm.model_executor.layers.utils import pack_weight_for_cpu, unquantized_gemm
from vllm.model_executor.model_loader.weight_utils import (
    check_weight_dtype,
    default_weight_loader,
)
from vllm.model_executor.utils import set_weight_attrs


def tp_size_and_rank() -> tuple[int, int]:
    """Tensor-parallel world size and rank of this process."""
    return get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()


@dataclass(frozen=True)
class LinearWeightSpec:
    """The arguments of `create_weights`: this rank's part of a linear layer
    (methods implement `create_linear_weights(layer, spec)`, so upstream's
    signature is written once, in `LinearMethodBase.create_weights`)."""

    input_size_per_partition: int
    output_partition_sizes: list[int]  # one per fused part (QKV, gate_up)
    input_size: int  # the whole layer's, over all ranks
    output_size: int
    params_dtype: torch.dtype
    extra_weight_attrs: dict[str, Any]  # set on every parameter (its `weight_loader`)

    @property
    def output_size_per_partition(self) -> int:
        return sum(self.output_partition_sizes)

    @property
    def weight_loader(self) -> Any:
        return self.extra_weight_attrs["weight_loader"]


class LinearMethodBase(QuantizeMethodBase):
    """How a linear layer stores and multiplies its weight."""

    def create_weights(  # type: ignore[override]
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        """Register this rank's weight parameters on `layer`; every one gets
        `extra_weight_attrs` (its `weight_loader`) and its `output_dim` /
        `input_dim` (None: not split over the ranks)."""
        spec = LinearWeightSpec(
            input_size_per_partition,
            output_partition_sizes,
            input_size,
            output_size,
            params_dtype,
            extra_weight_attrs,
        )
        self.create_linear_weights(layer, spec)

    def create_linear_weights(self, layer: Any, spec: LinearWeightSpec) -> None:
        """`create_weights` with its arguments in one `spec` (what each
        method implements)."""
        raise NotImplementedError

    def apply(  # type: ignore[override]
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x [..., in_per_partition] -> [..., out_per_partition] (+ bias)."""
        raise NotImplementedError


class UnquantizedLinearMethod(LinearMethodBase):
    """A dense [out, in] `weight` in the model dtype; on CPU it is repacked
    once loaded into its GEMM's layout (oneDNN's, or float32 panels:
    layers/utils.py). `layer` is
    typed Any: the attributes read here are the ones `create_weights` set."""

    def create_linear_weights(self, layer: Any, spec: LinearWeightSpec) -> None:
        shape = (spec.output_size_per_partition, spec.input_size_per_partition)
        weight = Parameter(torch.empty(shape, dtype=spec.params_dtype), requires_grad=False)
        set_weight_attrs(weight, {"output_dim": 0, "input_dim": 1, **spec.extra_weight_attrs})
        layer.register_parameter("weight", weight)
        layer._packed_weight = None  # set after loading on CPU

    def process_weights_after_loading(self, layer: Any) -> None:
        """Repack the weight for the CPU GEMM and drop the dense copy (its
        loaders are no longer needed); other devices keep it."""
        packed = pack_weight_for_cpu(layer.weight)
        if packed is not None:
            layer._packed_weight = packed
            layer.weight = Parameter(torch.empty(0, dtype=layer.weight.dtype), requires_grad=False)

    def apply(  # type: ignore[override]
        self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return unquantized_gemm(x, layer.weight, bias, layer._packed_weight)


class LinearBase(nn.Module):
    """Holds the shared state: sizes, dtype, the quant method (which owns
    the weight) and an optional bias."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        skip_bias_add: bool = False,
        params_dtype: torch.dtype | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.skip_bias_add = skip_bias_add
        self.params_dtype = params_dtype or torch.get_default_dtype()
        self.prefix = prefix
        self.quant_config = quant_config
        self.tp_size, self.tp_rank = tp_size_and_rank()
        method = quant_config.get_quant_method(self, prefix) if quant_config else None
        if method is not None and not isinstance(method, LinearMethodBase):
            raise TypeError(f"{type(method).__name__} is not a linear method ({prefix}).")
        self.quant_method: LinearMethodBase = method or UnquantizedLinearMethod()

    def _create_weights(
        self,
        output_partition_sizes: list[int],
        in_features: int,
        bias: bool,
        bias_output_dim: int | None = 0,
    ) -> None:
        """The weight parameters (by the quant method) and the bias;
        `bias_output_dim` is None for a bias that is replicated rather than
        split over the ranks."""
        self.quant_method.create_weights(
            self,
            in_features,
            output_partition_sizes,
            self.input_size,
            self.output_size,
            self.params_dtype,
            weight_loader=self.weight_loader,
        )
        if bias:
            self.bias = Parameter(
                torch.empty(sum(output_partition_sizes), dtype=self.params_dtype),
                requires_grad=False,
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

    def _rank_slice(self, loaded_weight: torch.Tensor, dim: int, shard: int) -> torch.Tensor:
        """This rank's `shard` entries along `dim` of a checkpoint tensor that
        must hold `shard` per rank (a ValueError naming both shapes if not)."""
        if loaded_weight.dim() <= dim or loaded_weight.shape[dim] != shard * self.tp_size:
            raise ValueError(
                f"{self.prefix}: checkpoint tensor of shape {tuple(loaded_weight.shape)} does "
                f"not hold {shard} x {self.tp_size} ranks along dim {dim}."
            )
        return loaded_weight.narrow(dim, self.tp_rank * shard, shard)

    def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
        """Once loaded, let the quant method repack the weights for its kernel."""
        self.quant_method.process_weights_after_loading(self)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, Parameter | None]:
        """x [..., input_size] -> ([..., output_size_per_partition], bias or None)."""
        if self.skip_bias_add:
            return self.quant_method.apply(self, x, None), self.bias
        return self.quant_method.apply(self, x, self.bias), None

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
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__(input_size, output_size, skip_bias_add, params_dtype, quant_config, prefix)
        self._create_weights([output_size], input_size, bias)

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
        quant_config: QuantizationConfig | None = None,
        output_sizes: list[int] | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__(input_size, output_size, skip_bias_add, params_dtype, quant_config, prefix)
        self.gather_output = gather_output
        self.output_sizes = output_sizes or [output_size]
        self.output_size_per_partition = divide(output_size, self.tp_size)
        self._create_weights(self._output_partition_sizes(), input_size, bias)

    def _output_partition_sizes(self) -> list[int]:
        """This rank's rows of each fused output (one for a plain layer)."""
        return [divide(size, self.tp_size) for size in self.output_sizes]

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
        """This rank's part along the parameter's `output_dim` (0 for a dense
        [out, in] weight, 1 for GPTQ / AWQ's [in, out]-major tensors); a
        parameter without one (GPTQ's g_idx) is loaded whole."""
        output_dim = getattr(param, "output_dim", None)
        if output_dim is not None:
            loaded_weight = self._rank_slice(
                loaded_weight, output_dim, param.data.shape[output_dim]
            )
        default_weight_loader(param, loaded_weight)

    def _copy_shard(
        self, param: Parameter, loaded_weight: torch.Tensor, offset: int, size: int, rank_index: int
    ) -> None:
        """Copy entries [rank_index * size, +size) along the output dim of a
        checkpoint tensor into [offset, offset + size) of the fused parameter.
        A parameter packed along the output dim (`packed_dim == output_dim`:
        an int4 zero point, AWQ's qweight: 8 outputs per int32) holds one entry
        per `pack_factor` outputs, so both are divided by it. A parameter not
        split over the outputs (`output_dim` None) is the same for every shard:
        it is copied whole, and a shard that disagrees with the one loaded
        before it is refused."""
        output_dim = getattr(param, "output_dim", None)
        check_weight_dtype(param, loaded_weight)
        if output_dim is None:
            self._copy_shared(param, loaded_weight)
            return
        if getattr(param, "packed_dim", None) == output_dim:
            factor = int(getattr(param, "pack_factor", 1))
            if offset % factor or size % factor:
                raise ValueError(
                    f"{self.prefix}: shard rows [{offset}, +{size}) do not split into whole "
                    f"packed rows of {factor}; choose another tensor-parallel size."
                )
            offset, size = offset // factor, size // factor
        dst = param.data.narrow(output_dim, offset, size)
        if loaded_weight.dim() <= output_dim:
            raise ValueError(
                f"{self.prefix}: checkpoint tensor of shape {tuple(loaded_weight.shape)} has "
                f"no dim {output_dim} to split."
            )
        src = loaded_weight.narrow(output_dim, rank_index * size, size)
        if dst.shape != src.shape:
            raise ValueError(
                f"Shard shape mismatch: parameter slice {tuple(dst.shape)} vs "
                f"checkpoint {tuple(src.shape)}."
            )
        dst.copy_(src)

    def _copy_shared(self, param: Parameter, loaded_weight: torch.Tensor) -> None:
        """A fused layer's parameter that every shard carries in full (GPTQ's
        g_idx: q, k and v see the same input): the first shard's copy is kept
        and the others must equal it."""
        seen: set[int] = self.__dict__.setdefault("_shared_params_loaded", set())
        if id(param) not in seen:
            default_weight_loader(param, loaded_weight)
            seen.add(id(param))
            return
        if param.data.shape != loaded_weight.shape or not torch.equal(
            param.data, loaded_weight.to(param.dtype)
        ):
            raise ValueError(
                f"{self.prefix}: the fused shards carry different values of a parameter "
                f"they must share (shape {tuple(loaded_weight.shape)}); this is not supported."
            )


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
        quant_config: QuantizationConfig | None = None,
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
        quant_config: QuantizationConfig | None = None,
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
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__(input_size, output_size, skip_bias_add, params_dtype, quant_config, prefix)
        self.input_is_parallel = input_is_parallel
        self.reduce_results = reduce_results
        self.input_size_per_partition = divide(input_size, self.tp_size)
        self._create_weights(
            [output_size],
            self.input_size_per_partition,
            bias,
            bias_output_dim=None,  # the bias is replicated, not split
        )

    def weight_loader(
        self, param: Parameter, loaded_weight: torch.Tensor, loaded_shard_id: Any = None
    ) -> None:
        """This rank's part along the parameter's `input_dim` (1 for a dense
        [out, in] weight, 0 for GPTQ / AWQ's [in, out]-major tensors; packed
        along it, the parameter's own size is already the packed one); a
        parameter without one (the bias, a per-channel scale) is loaded whole."""
        input_dim = getattr(param, "input_dim", None)
        if input_dim is not None:
            loaded_weight = self._rank_slice(loaded_weight, input_dim, param.data.shape[input_dim])
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
        output = self.quant_method.apply(self, x, None)
        if self.reduce_results:
            output = tensor_model_parallel_all_reduce(output)
        if self.skip_bias_add:
            return output, self.bias
        # The bias is counted once: after the sum, or (when the caller sums
        # later) on rank 0 only.
        if self.bias is not None and (self.reduce_results or self.tp_rank == 0):
            output = output + self.bias
        return output, None
