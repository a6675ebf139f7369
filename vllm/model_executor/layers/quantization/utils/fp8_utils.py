"""FP8 (e4m3) linear helpers shared by the `fp8` method and the
compressed-tensors FP8 schemes (upstream: quantization/utils/fp8_utils.py,
w8a8_utils.py and `scaled_fp8_quant` of vllm/_custom_ops.py).

Storage: one byte per weight, `torch.float8_e4m3fn` (sign bit, 4 exponent
bits with bias 7, 3 mantissa bits; no infinities, 0x7f / 0xff are NaN, the
largest finite value is 448). The real weight is float(q) * scale, with the
scale per tensor, per output channel or per [block_n, block_k] block.

Kernel (CPU): every layout is turned, once loaded, into the one the
weight-only GEMM takes: `ops.fp8_weight_gemm(x, w fp8 [N, K], scales fp32
[N, K // g], g)` (g = K: per channel; g = block_k: a block scale repeated over
the block's rows). Activation quantization (W8A8: dynamic per token, dynamic
per token-group of block_k, or static per tensor) keeps W8A8's numerics by
fake-quantizing x before that GEMM: x_fq = float(q_x) * s_x in float32, so
x_fq @ W.T = s_x * s_w * (q_x . q_w) up to float32 summation order (every
e4m3 x e4m3 product is exact in float32). Measured on this machine (AMD EPYC,
2 threads, 2048 x 2048, bf16 out): torch._scaled_mm on CPU takes 9 ms for one
token and 60 ms for 128 (dense bf16 F.linear: 0.26 / 1.4 ms), so it is not used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn.parameter import Parameter

from vllm import _custom_ops as ops
from vllm.model_executor.utils import set_weight_attrs

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448.0
# Upstream's floor on a dynamic scale (1 / (448 * 512)): an all-zero row
# quantizes to zeros instead of 0 / 0.
MIN_SCALING_FACTOR = 1.0 / (FP8_MAX * 512.0)


def to_fp8(x: torch.Tensor) -> torch.Tensor:
    """Round float values (already divided by their scale) to e4m3,
    saturating at +-448 (torch's cast alone turns overflow into NaN)."""
    return x.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def scaled_fp8_quant(
    x: torch.Tensor,
    scale: torch.Tensor | None = None,
    use_per_token_if_dynamic: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (e4m3 q, float32 scale) with x ~ float(q) * scale.
    Static (`scale` given, one value): q = fp8(x / scale). Dynamic: the scale
    is max|x| / 448 (at least MIN_SCALING_FACTOR) over the whole tensor, or
    per row ([..., 1]) when `use_per_token_if_dynamic`."""
    xf = x.float()
    if scale is None:
        if use_per_token_if_dynamic:
            amax = xf.abs().amax(dim=-1, keepdim=True)
        else:
            amax = xf.abs().amax().reshape(1)
        scale = (amax / FP8_MAX).clamp(min=MIN_SCALING_FACTOR)
    scale = scale.float()
    return to_fp8(xf / scale), scale


def per_token_group_quant_fp8(
    x: torch.Tensor, group_size: int, eps: float = 1e-10
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 q [M, K], float32 scales [M, K // group_size]): each
    run of `group_size` columns of a row gets max(|x|, eps) / 448 (the
    activation quantization of block-quantized checkpoints)."""
    m, k = x.shape
    groups = x.float().reshape(m, k // group_size, group_size)
    scale = groups.abs().amax(dim=-1).clamp(min=eps) / FP8_MAX
    q = to_fp8(groups / scale.unsqueeze(-1)).reshape(m, k)
    return q, scale


def fake_quant_input(
    x: torch.Tensor, act: str | None, input_scale: torch.Tensor | None, group_size: int
) -> torch.Tensor:
    """x [M, K] as the W8A8 GEMM sees it: float(q_x) * s_x in float32.
    `act`: None (weight-only: x as is), "token" (dynamic per row), "group"
    (dynamic per row and `group_size` columns) or "tensor" (static
    `input_scale`)."""
    if act is None:
        return x
    if act == "group":
        q, s = per_token_group_quant_fp8(x, group_size)
        return (q.float().reshape(x.shape[0], -1, group_size) * s.unsqueeze(-1)).reshape(x.shape)
    q, s = scaled_fp8_quant(x, input_scale if act == "tensor" else None, act == "token")
    return q.float() * s


def apply_fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    group_size: int,
    act: str | None,
    input_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [..., K] @ (float(weight) * weight_scale).T (+ bias) -> [..., N] in
    x's dtype; `weight` e4m3 [N, K], `weight_scale` float32 [N, K // group_size]
    and `act` the activation quantization (see `fake_quant_input`)."""
    x2d = x.reshape(-1, x.shape[-1])
    xq = fake_quant_input(x2d, act, input_scale, group_size)
    out = ops.fp8_weight_gemm(xq, weight, weight_scale, group_size).to(x.dtype)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


def convert_to_channelwise(weight_scale: torch.Tensor, logical_widths: list[int]) -> torch.Tensor:
    """Per-shard scalars [len(logical_widths)] -> float32 [N, 1]: each
    shard's scale repeated over its output rows (upstream's name)."""
    widths = torch.tensor(logical_widths, device=weight_scale.device)
    return torch.repeat_interleave(weight_scale.float().reshape(-1), widths).unsqueeze(1)


def requantize_with_max_scale(
    weight: torch.Tensor, weight_scale: torch.Tensor, logical_widths: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """A fused layer (QKV, gate_up) loaded from per-tensor shards, each with
    its own scale s_i, is given ONE scale S = max(s_i), as upstream does for
    its per-tensor W8A8 GEMM: the rows of shard i become
    fp8(float(q_i) * s_i / S) (exactly q_i where s_i == S; others lose at
    most half an e4m3 step). Returns (S as float32 [1], weight)."""
    scales = weight_scale.float().reshape(-1)
    max_scale = scales.max()
    start = 0
    for width, s in zip(logical_widths, scales.tolist(), strict=True):
        if s != float(max_scale):
            rows = weight[start : start + width]
            rows.copy_(to_fp8(rows.float() * s / max_scale))
        start += width
    return max_scale.reshape(1), weight


def expand_block_scale(
    scale: torch.Tensor, block_n: int, n: int, block_k: int, k: int
) -> torch.Tensor:
    """Block scales [ceil(N / block_n), ceil(K / block_k)] -> float32
    [N, K // block_k], block row i repeated over its block_n weight rows
    (the per-row groups `fp8_weight_gemm` takes)."""
    if k % block_k:
        raise ValueError(
            f"input size {k} is not a multiple of the fp8 block size {block_k}; "
            "the CPU kernel takes whole blocks only."
        )
    rows = torch.arange(n, device=scale.device) // block_n
    return scale.float()[rows][:, : k // block_k].contiguous()


def check_fp8_loader(inner: Callable[..., None]) -> Callable[..., None]:
    """`inner` (a layer's weight loader) refusing any checkpoint tensor that
    is not float8_e4m3fn: a bf16 or e5m2 tensor would otherwise be cast
    silently into the fp8 parameter."""

    def load(param: Parameter, loaded_weight: torch.Tensor, *args: Any) -> None:
        if loaded_weight.dtype != FP8_DTYPE:
            raise ValueError(
                f"expected a {FP8_DTYPE} fp8 weight, got a {loaded_weight.dtype} tensor "
                "(the checkpoint's quantization_config says the weights are fp8)."
            )
        inner(param, loaded_weight, *args)

    return load


def create_fp8_weight(layer: Any, rows: int, cols: int, weight_loader: Callable[..., None]) -> None:
    """The e4m3 `weight` [rows, cols] (split over ranks like a dense weight)."""
    weight = Parameter(torch.empty(rows, cols, dtype=FP8_DTYPE), requires_grad=False)
    set_weight_attrs(
        weight,
        {"weight_loader": check_fp8_loader(weight_loader), "output_dim": 0, "input_dim": 1},
    )
    layer.register_parameter("weight", weight)


def logical_widths(layer: Any, sizes: list[int]) -> list[int]:
    """This rank's output rows of each checkpoint tensor a layer fuses. The
    QKV layer here hands its quant method one partition (upstream hands
    three), so its q / k / v widths are taken from its head counts."""
    if len(sizes) == 1 and hasattr(layer, "num_kv_heads") and hasattr(layer, "head_size"):
        q = layer.num_heads * layer.head_size
        kv = layer.num_kv_heads * layer.head_size
        if q + 2 * kv == sizes[0]:
            return [q, kv, kv]
    return list(sizes)


def _shard_index(shard_id: Any) -> int | None:
    """A loader's shard id as a position: QKV's "q" / "k" / "v" -> 0 / 1 / 2,
    a merged layer's int as is; None (an unfused or already fused tensor)."""
    if shard_id is None:
        return None
    if isinstance(shard_id, str):
        return "qkv".index(shard_id)
    return int(shard_id)


def per_tensor_scale_loader(param: Parameter, loaded_weight: torch.Tensor, *args: Any) -> None:
    """One scale per checkpoint tensor ([] or [1]) into its shard's entry of
    a [num_shards] parameter (every entry for a tensor with no shard id).
    The same value on every tensor-parallel rank."""
    if loaded_weight.numel() != 1:
        raise ValueError(f"expected one per-tensor scale, got shape {tuple(loaded_weight.shape)}.")
    if not loaded_weight.dtype.is_floating_point:
        raise ValueError(f"expected a float scale, got a {loaded_weight.dtype} tensor.")
    index = _shard_index(args[0] if args else None)
    value = float(loaded_weight.reshape(()).float())
    if index is None:
        param.data.fill_(value)
    else:
        param.data[index] = value


def _nan_param(*shape: int) -> Parameter:
    """Scales start as NaN so that a shard the checkpoint lacks is caught."""
    return Parameter(torch.full(shape, float("nan"), dtype=torch.float32), requires_grad=False)


class Fp8WeightLayout:
    """How one linear's fp8 weight is laid out in the checkpoint and run.

    strategy: "tensor" (a scale per checkpoint tensor: [num_shards], one per
    fused part), "channel" ([N, 1]) or "block" ([ceil(N / bn), ceil(K / bk)]
    for `block` = [bn, bk]). act: the activation quantization (None for
    weight-only; "token", "group" or "tensor", see `fake_quant_input`);
    "tensor" registers `input_scale` (a scalar per fused part; the largest is
    used, as upstream). `requantize`: give a fused per-tensor layer one scale
    (`requantize_with_max_scale`, upstream's W8A8 path) instead of expanding
    the per-part scales to channels (upstream's weight-only path).
    `layer` is typed Any: the attributes read are those `create` sets."""

    def __init__(
        self,
        strategy: str,
        act: str | None,
        block: list[int] | None = None,
        scale_name: str = "weight_scale",
        requantize: bool = False,
    ) -> None:
        if strategy not in ("tensor", "channel", "block"):
            raise ValueError(f"unknown fp8 weight strategy {strategy!r}.")
        if (strategy == "block") != (block is not None):
            raise ValueError("an fp8 block strategy needs a [block_n, block_k] block size.")
        self.strategy, self.act, self.block = strategy, act, block
        self.scale_name, self.requantize = scale_name, requantize

    def create(
        self, layer: Any, sizes: list[int], k: int, weight_loader: Callable[..., None]
    ) -> None:
        """`weight` (e4m3 [sum(sizes), k]), the weight scale and, for a static
        activation scale, `input_scale`, each loadable per fused part."""
        n = sum(sizes)
        sizes = logical_widths(layer, sizes)
        layer.logical_widths = sizes
        create_fp8_weight(layer, n, k, weight_loader)
        if self.strategy == "tensor":
            scale = _nan_param(len(sizes))
            set_weight_attrs(scale, {"weight_loader": per_tensor_scale_loader})
        elif self.strategy == "channel":
            scale = _nan_param(n, 1)
            set_weight_attrs(scale, {"weight_loader": weight_loader, "output_dim": 0})
        else:
            assert self.block is not None
            bn, bk = self.block
            validate_fp8_block_shape(layer, sizes, k, bn, bk)
            scale = _nan_param(-(-n // bn), -(-k // bk))
            # Packed along the output dim: one row per bn weight rows, so the
            # fused loaders place each part at offset / bn.
            attrs = {"output_dim": 0, "input_dim": 1, "packed_dim": 0, "pack_factor": bn}
            set_weight_attrs(scale, {"weight_loader": weight_loader, **attrs})
        layer.register_parameter(self.scale_name, scale)
        if self.act == "tensor":
            input_scale = _nan_param(len(sizes))
            set_weight_attrs(input_scale, {"weight_loader": per_tensor_scale_loader})
            layer.register_parameter("input_scale", input_scale)

    def process_weights_after_loading(self, layer: Any) -> None:
        """Turn the loaded scales into float32 [N, K // g] groups (see the
        module docstring); refuse scales the checkpoint did not provide."""
        scale = getattr(layer, self.scale_name).data
        _check_loaded(layer, self.scale_name, scale)
        weight = layer.weight.data
        n, k = weight.shape
        group = k
        if self.strategy == "tensor" and self.requantize and len(layer.logical_widths) > 1:
            max_scale, weight = requantize_with_max_scale(weight, scale, layer.logical_widths)
            scale = max_scale.expand(n).reshape(n, 1)
        elif self.strategy == "tensor":
            scale = convert_to_channelwise(scale, layer.logical_widths)
        elif self.strategy == "block":
            assert self.block is not None
            group = self.block[1]
            scale = expand_block_scale(scale, self.block[0], n, group, k)
        layer.fp8_group_size = group
        setattr(layer, self.scale_name, Parameter(scale.float().contiguous(), requires_grad=False))
        input_scale = None
        if self.act == "tensor":
            input_scale = layer._parameters.pop("input_scale").data
            _check_loaded(layer, "input_scale", input_scale)
            input_scale = input_scale.max().reshape(1)
        layer.input_scale = input_scale

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        scale = getattr(layer, self.scale_name)
        return apply_fp8_linear(
            x, layer.weight, scale, layer.fp8_group_size, self.act, layer.input_scale, bias
        )


def _check_loaded(layer: Any, name: str, value: torch.Tensor) -> None:
    """A scale still NaN was never loaded: name the layer and the parts."""
    missing = torch.isnan(value).reshape(value.shape[0], -1).any(dim=1)
    if bool(missing.any()):
        prefix = getattr(layer, "prefix", "layer")
        raise ValueError(
            f"{prefix}: the checkpoint has no {name!r} for "
            f"{int(missing.sum())} of {value.shape[0]} entries (an fp8 checkpoint "
            f"needs every quantized linear's {name})."
        )


def validate_fp8_block_shape(layer: Any, sizes: list[int], k: int, bn: int, bk: int) -> None:
    """Block-quantized weights split over ranks (or fused from parts) must
    split on block boundaries (upstream's checks), else a ValueError."""
    prefix = getattr(layer, "prefix", "layer")
    tp = getattr(layer, "tp_size", 1)
    if tp > 1 and k != getattr(layer, "input_size", k) and k % bk:
        raise ValueError(
            f"{prefix}: input size per rank {k} is not a multiple of the fp8 block_k {bk}; "
            "choose another tensor-parallel size."
        )
    # Upstream lets the last part of a fused layer end in a partial block;
    # the fused loaders here place parts in whole blocks, so every part must.
    split = tp > 1 and sum(sizes) != getattr(layer, "output_size", sum(sizes))
    for size in sizes if split or len(sizes) > 1 else []:
        if size % bn:
            raise ValueError(
                f"{prefix}: output size {size} (per rank or fused part) is not a multiple "
                f"of the fp8 block_n {bn}."
            )
