"""GGUF weights kept quantized (upstream: vllm/model_executor/layers/quantization/gguf.py).

A .gguf file stores each matrix as ggml blocks (utils/gguf_quants.py says which
bytes mean what). The GGUF loader hands every quantized tensor over as its raw
bytes, uint8 [rows, row bytes] named `<module>.qweight`, plus `qweight_type`
(the ggml type of each row, int32 [rows]); rows are output features and a row
is whole blocks along the input features, so the ordinary linear loaders
shard both (tensor parallel: rows per rank, or whole blocks per rank along the
input of a row-parallel layer). Once loaded, each layer decodes its bytes
once into the form its kernel takes:

  * every row 4-bit (Q4_0, Q4_1, Q4_K; group 32), bf16 / fp16 model:
    `aten._weight_int4pack_mm_for_cpu` (utils/int4_cpu.py), w = (u - 8) * scale
    + zero with u the 4-bit value (a float32 model takes the int8 form below:
    that kernel is slow with float32 activations);
  * otherwise (Q8_0, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, Q6_K, or a fused layer whose
    parts have different types, as Q4_K_M files mix Q4_K and Q6_K):
    `vllm._custom_ops.int8_group_gemm`, w = q * scale (+ offset) per group of 16
    or 32 (the smallest of the layer's types; a 32-group's scale is repeated).

F32 / F16 / BF16 tensors stay dense (UnquantizedLinearMethod, as upstream's
`unquantized_modules`). The token embedding (`GGUFEmbeddingMethod`) keeps its
table as int8 values + group scales: a lookup dequantizes only the looked-up
rows, and a tied LM head computes its logits from the same table through the
int8 group GEMM. Other ggml types are refused at start-up naming the tensor.
The kernels are CPU ones: another device is refused at start-up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parameter import Parameter

from vllm.model_executor.layers.linear import (
    LinearBase,
    LinearMethodBase,
    LinearWeightSpec,
    UnquantizedLinearMethod,
)
from vllm.model_executor.layers.quantization.base_config import (
    CPUQuantizationConfig,
    QuantizeMethodBase,
)
from vllm.model_executor.layers.quantization.utils.gguf_quants import (
    GGML_DENSE_TYPES,
    GGML_INT4_TYPES,
    GGML_QUANT_TYPES,
    GGUFDecoded,
    decode_gguf_rows,
    ggml_type_name,
    gguf_group_size,
    gguf_row_bytes,
)
from vllm.model_executor.layers.quantization.utils.int4_cpu import int4_cpu_linear, pack_int4_cpu
from vllm.model_executor.utils import set_weight_attrs

BUILT_GGUF_TYPES = ", ".join(ggml_type_name(t) for t in (*GGML_QUANT_TYPES, *GGML_DENSE_TYPES))


class GGUFConfig(CPUQuantizationConfig):
    """A .gguf model. The loader tells it each tensor's ggml type
    (`set_gguf_tensors`) before the model is built, so each layer gets its
    method and the byte size of its rows."""

    def __init__(self, unquantized_modules: list[str] | None = None) -> None:
        super().__init__()
        self.unquantized_modules: list[str] = list(unquantized_modules or [])
        self.tensor_types: dict[str, int] = {}  # GGUF tensor name -> ggml type
        self._name_map: Any = None  # gguf.TensorNameMap: HF module -> GGUF name (get_name)
        self.gguf_path = ""

    def __repr__(self) -> str:
        return f"GGUFConfig(file={self.gguf_path!r})"

    def get_name(self) -> str:
        return "gguf"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> GGUFConfig:
        return cls()

    def set_gguf_tensors(self, path: str, tensor_types: dict[str, int], name_map: Any) -> None:
        """The file's tensors (name -> ggml type) and its gguf.TensorNameMap
        (HF module name -> GGUF name, by `get_name`)."""
        self.gguf_path = path
        self.tensor_types = dict(tensor_types)
        self._name_map = name_map

    def weight_types(self, prefix: str) -> list[int] | None:
        """The ggml type of each checkpoint weight a layer named `prefix` holds
        (one per part of a fused layer); None when the file has none of them."""
        if self._name_map is None:
            raise ValueError(
                "GGUF layers are built by the GGUF model loader (load_format 'auto' or "
                "'gguf'); this load format cannot build a quantized .gguf model."
            )
        parent, _, last = prefix.rpartition(".")
        parts = self.packed_modules_mapping.get(last, [last])
        types = []
        for part in parts:
            gguf_name = self._name_map.get_name(f"{parent}.{part}" if parent else part)
            qtype = self.tensor_types.get(f"{gguf_name}.weight") if gguf_name else None
            if qtype is None:
                return None
            if qtype not in GGML_QUANT_TYPES and qtype not in GGML_DENSE_TYPES:
                raise ValueError(
                    f"{self.gguf_path}: tensor {gguf_name}.weight has GGUF type "
                    f"{ggml_type_name(qtype)}, which is not built here (built: {BUILT_GGUF_TYPES})."
                )
            types.append(qtype)
        return types

    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

        if not isinstance(layer, (LinearBase, VocabParallelEmbedding)):
            return None
        types = self.weight_types(prefix)
        if types is None:
            if isinstance(layer, VocabParallelEmbedding):
                return None  # a tied LM head: it becomes the embedding
            raise ValueError(f"{self.gguf_path}: no GGUF tensor for layer {prefix!r}.")
        dense = [t in GGML_DENSE_TYPES for t in types]
        if all(dense):
            self.unquantized_modules.append(prefix)
            return UnquantizedLinearMethod() if isinstance(layer, LinearBase) else None
        if any(dense):
            raise ValueError(
                f"{self.gguf_path}: the parts of fused layer {prefix!r} mix dense and quantized "
                f"types ({[ggml_type_name(t) for t in types]}); this is not built."
            )
        if isinstance(layer, VocabParallelEmbedding):
            return GGUFEmbeddingMethod(types[0])
        return GGUFLinearMethod(types)


def _padding_loader(weight_loader: Callable[..., None], width: int) -> Callable[..., None]:
    """The layer's loader, with rows narrower than `width` bytes (the parts of
    a fused layer whose type has smaller rows) zero-padded to it first."""

    def load(param: Parameter, loaded_weight: torch.Tensor, *args: Any) -> None:
        if loaded_weight.dim() == 2 and loaded_weight.shape[1] < width:
            loaded_weight = F.pad(loaded_weight, (0, width - loaded_weight.shape[1]))
        weight_loader(param, loaded_weight, *args)

    return load


class GGUFLinearMethod(LinearMethodBase):
    """A linear layer from GGUF blocks (the types of its parts, in order).
    `layer` is typed Any: the attributes read are those `create_weights` set."""

    def __init__(self, weight_types: list[int]) -> None:
        self.weight_types = weight_types

    def create_linear_weights(self, layer: Any, spec: LinearWeightSpec) -> None:
        k = spec.input_size_per_partition
        try:
            width = max(gguf_row_bytes(t, k) for t in self.weight_types)
        except ValueError as e:
            raise ValueError(
                f"{getattr(layer, 'prefix', 'layer')}: input size {k} per rank does not split "
                f"into whole GGUF blocks ({e}); choose another tensor-parallel size."
            ) from e
        rows = spec.output_size_per_partition
        extra_weight_attrs = dict(spec.extra_weight_attrs)
        loader = _padding_loader(extra_weight_attrs.pop("weight_loader"), width)
        qweight = Parameter(torch.zeros(rows, width, dtype=torch.uint8), requires_grad=False)
        set_weight_attrs(
            qweight,
            {"weight_loader": loader, "output_dim": 0, "input_dim": 1, **extra_weight_attrs},
        )
        qtype = Parameter(torch.full((rows,), -1, dtype=torch.int32), requires_grad=False)
        set_weight_attrs(qtype, {"weight_loader": loader, "output_dim": 0, **extra_weight_attrs})
        layer.register_parameter("qweight", qweight)
        layer.register_parameter("qweight_type", qtype)
        layer.gguf_k = k
        layer.gguf_group_size = 0  # 0: int4 kernel (group 32); else the int8 group size

    def process_weights_after_loading(self, layer: Any) -> None:
        """Decode the blocks once into the kernel's form (module docstring)."""
        raw, row_types, k = layer.qweight.data, layer.qweight_type.data, layer.gguf_k
        types = sorted(set(row_types.tolist()))
        if not set(types) <= set(self.weight_types):
            raise ValueError(
                f"{getattr(layer, 'prefix', 'layer')}: rows of GGUF types {types} loaded, "
                f"expected {[ggml_type_name(t) for t in self.weight_types]} (rows not loaded?)."
            )
        parts = [(row_types == t, decode_gguf_rows(raw[row_types == t], t, k)) for t in types]
        del layer.qweight, layer.qweight_type
        if use_int4_kernel(types, raw.device, layer.params_dtype):
            packed, scale_and_zero = to_int4(parts, raw.shape[0], k, layer.params_dtype)
            layer.qweight = Parameter(packed, requires_grad=False)
            layer.scales = Parameter(scale_and_zero, requires_grad=False)
            layer.offsets = None
            return
        merged = merge_decoded(parts, raw.shape[0], k)
        layer.qweight = Parameter(merged.q, requires_grad=False)
        layer.scales = Parameter(merged.scale, requires_grad=False)
        layer.offsets = None if merged.offset is None else Parameter(merged.offset, False)
        layer.gguf_group_size = merged.group_size

    def apply(  # type: ignore[override]
        self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        if layer.gguf_group_size == 0:
            return int4_cpu_linear(x, layer.qweight, layer.scales, 32, bias)
        out = _int8_gemm(x, layer.qweight, layer.scales, layer.gguf_group_size, layer.offsets)
        return out if bias is None else out + bias


def use_int4_kernel(types: list[int], device: torch.device, dtype: torch.dtype) -> bool:
    """4-bit rows go to torch's int4 kernel for bf16 / fp16 activations. With
    float32 ones that kernel is far slower than the int8 group GEMM (measured
    on this AVX-512 CPU, M = 16: 20-76 ms vs 0.07-0.2 ms for 576-3072 x 576),
    so float32 models take the int8 form of the same values."""
    return (
        all(t in GGML_INT4_TYPES for t in types)
        and device.type == "cpu"
        and dtype in (torch.bfloat16, torch.float16)
    )


def _int8_gemm(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, group: int, offset: torch.Tensor | None
) -> torch.Tensor:
    from vllm import _custom_ops as ops

    return ops.int8_group_gemm(x, q, scale, group, offset)


def merge_decoded(parts: list[tuple[torch.Tensor, GGUFDecoded]], n: int, k: int) -> GGUFDecoded:
    """One int8 form for rows decoded per type (row mask, decoded rows): the
    smallest group size of them, a larger group's scale / offset repeated."""
    if len(parts) == 1:
        return parts[0][1]
    group = min(d.group_size for _, d in parts)
    q = torch.empty(n, k, dtype=torch.int8)
    scale = torch.empty(n, k // group, dtype=torch.float32)
    has_offset = any(d.offset is not None for _, d in parts)
    offset = torch.zeros(n, k // group, dtype=torch.float32) if has_offset else None
    for rows, d in parts:
        repeat = d.group_size // group
        q[rows] = d.q
        scale[rows] = d.scale.repeat_interleave(repeat, dim=1)
        if offset is not None and d.offset is not None:
            offset[rows] = d.offset.repeat_interleave(repeat, dim=1)
    return GGUFDecoded(q, scale, offset, group)


def to_int4(
    parts: list[tuple[torch.Tensor, GGUFDecoded]], n: int, k: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """4-bit rows (group 32) in the int4 kernel's form: u in 0..15 and
    w = (u - 8) * scale + zero. Q4_0 decodes to q = u - 8 (no offset): u = q + 8,
    zero = 0; Q4_1 / Q4_K decode to u with w = u * scale + offset: zero = offset + 8 * scale."""
    u = torch.empty(n, k, dtype=torch.int32)
    scale = torch.empty(n, k // 32, dtype=torch.float32)
    zero = torch.zeros(n, k // 32, dtype=torch.float32)
    for rows, d in parts:
        scale[rows] = d.scale
        if d.offset is None:
            u[rows] = d.q.to(torch.int32) + 8
        else:
            u[rows] = d.q.to(torch.int32)
            zero[rows] = d.offset + 8 * d.scale
    return pack_int4_cpu(u, scale.to(dtype), zero.to(dtype))


class GGUFEmbeddingMethod(LinearMethodBase):
    """A GGUF embedding table (and the LM head it may serve): int8 values with
    float32 group scales (and offsets). `layer` is a VocabParallelEmbedding,
    which calls `create_weights` as a linear does (rows = its vocabulary)."""

    def __init__(self, weight_type: int) -> None:
        self.weight_type = weight_type

    def create_linear_weights(self, layer: Any, spec: LinearWeightSpec) -> None:
        k = spec.input_size_per_partition
        width = gguf_row_bytes(self.weight_type, k)
        rows = spec.output_size_per_partition
        qweight = Parameter(torch.zeros(rows, width, dtype=torch.uint8), requires_grad=False)
        set_weight_attrs(qweight, {"output_dim": 0, "input_dim": 1, **spec.extra_weight_attrs})
        layer.register_parameter("qweight", qweight)
        layer.gguf_k = k
        layer.gguf_group_size = gguf_group_size(self.weight_type)
        layer.params_dtype = spec.params_dtype

    def process_weights_after_loading(self, layer: Any) -> None:
        decoded = decode_gguf_rows(layer.qweight.data, self.weight_type, layer.gguf_k)
        layer.qweight = Parameter(decoded.q, requires_grad=False)
        layer.scales = Parameter(decoded.scale, requires_grad=False)
        layer.offsets = None if decoded.offset is None else Parameter(decoded.offset, False)

    def embedding(self, layer: Any, ids: torch.Tensor) -> torch.Tensor:
        """ids [T] (this rank's local rows) -> [T, dim]: only those rows dequantized."""
        g = layer.gguf_group_size
        rows = layer.qweight[ids].float().unflatten(-1, (-1, g)) * layer.scales[ids].unsqueeze(-1)
        if layer.offsets is not None:
            rows = rows + layer.offsets[ids].unsqueeze(-1)
        return rows.flatten(-2).to(layer.params_dtype)

    def apply(  # type: ignore[override]
        self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits x [T, dim] @ table.T -> [T, rows] (the tied or quantized LM head)."""
        out = _int8_gemm(x, layer.qweight, layer.scales, layer.gguf_group_size, layer.offsets)
        return out if bias is None else out + bias
