"""The `fp8` quantization method (upstream: vllm/model_executor/layers/quantization/fp8.py).

Two uses, as upstream:
- a serialized fp8 checkpoint, config.json's quantization_config
    {"quant_method": "fp8", "activation_scheme": "dynamic" | "static",
     "weight_block_size": [128, 128] (optional), "ignored_layers" /
     "modules_to_not_convert": [...] (optional)}
  with, per linear, `weight` float8_e4m3fn [out, in] and either
    `weight_scale` float32 [] or [1] (one scale per tensor; AutoFP8 /
    llm-compressor's older "fp8" output) and, when static, `input_scale` [] or [1];
  or, with weight_block_size [bn, bk] (DeepSeek-V3, Qwen3-FP8),
    `weight_scale_inv` float32 [ceil(out / bn), ceil(in / bk)]: despite the
    name, the multiplier of each block (w = float(q) * weight_scale_inv).
- `-q fp8` on an unquantized (bf16 / fp32) checkpoint ("online"): each
  linear's weight is loaded dense, then quantized to e4m3 with one scale per
  (fused) tensor, max|w| / 448, and the dense copy freed.

Activations are quantized to e4m3 as upstream does on fp8 hardware: dynamic
-> one scale per token (per token and bk columns for block weights), static ->
the checkpoint's input_scale (the largest of a fused layer's parts). A fused
layer (QKV, gate_up) whose parts have their own per-tensor scales is
requantized to one scale, their maximum (upstream's requantize_with_max_scale).
The weights stay fp8 in memory; utils/fp8_utils.py has the kernel path.
"""

from __future__ import annotations

from typing import Any

import torch
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
from vllm.model_executor.layers.quantization.utils.fp8_utils import (
    Fp8WeightLayout,
    apply_fp8_linear,
    scaled_fp8_quant,
)
from vllm.model_executor.layers.quantization.utils.quant_utils import is_layer_skipped

ACTIVATION_SCHEMES = ["static", "dynamic"]


class Fp8Config(CPUQuantizationConfig):
    """Config class for FP8 (serialized checkpoints, or `-q fp8` online)."""

    def __init__(
        self,
        is_checkpoint_fp8_serialized: bool = False,
        activation_scheme: str = "dynamic",
        ignored_layers: list[str] | None = None,
        weight_block_size: list[int] | None = None,
    ) -> None:
        super().__init__()
        self.is_checkpoint_fp8_serialized = is_checkpoint_fp8_serialized
        if activation_scheme not in ACTIVATION_SCHEMES:
            raise ValueError(
                f"fp8 quantization_config.activation_scheme={activation_scheme!r} is not "
                f"supported; choose one of {ACTIVATION_SCHEMES}."
            )
        self.activation_scheme = activation_scheme
        self.ignored_layers = list(ignored_layers or [])
        if weight_block_size is not None:
            if not is_checkpoint_fp8_serialized:
                raise ValueError(
                    "fp8 weight_block_size needs an fp8-serialized checkpoint (online "
                    "quantization is per tensor)."
                )
            if len(weight_block_size) != 2 or min(weight_block_size) <= 0:
                raise ValueError(
                    "fp8 quantization_config.weight_block_size must be two positive sizes "
                    f"[block_n, block_k], got {weight_block_size!r}."
                )
            if activation_scheme != "dynamic":
                raise ValueError(
                    "fp8 block-wise weights (weight_block_size) take dynamic activations "
                    f"only, got activation_scheme={activation_scheme!r}."
                )
        self.weight_block_size = list(weight_block_size) if weight_block_size else None

    def get_name(self) -> str:
        return "fp8"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Fp8Config:
        quant_method = str(cls.get_from_keys(config, ["quant_method"]))
        fmt = config.get("fmt") or "e4m3"
        if fmt != "e4m3":
            raise ValueError(f"fp8 quantization_config.fmt={fmt!r} is not built (built: e4m3).")
        ignored = cls.get_from_keys_or(config, ["ignored_layers"], None)
        if not ignored:
            ignored = cls.get_from_keys_or(config, ["modules_to_not_convert"], None)
        return cls(
            is_checkpoint_fp8_serialized="fp8" in quant_method,
            activation_scheme=cls.get_from_keys(config, ["activation_scheme"]),
            ignored_layers=ignored,
            weight_block_size=cls.get_from_keys_or(config, ["weight_block_size"], None),
        )

    def is_layer_skipped(self, prefix: str) -> bool:
        """Whether `ignored_layers` names the layer; a fused layer's parts
        must agree (upstream's is_layer_skipped)."""
        return is_layer_skipped(prefix, self.ignored_layers, self.packed_modules_mapping)

    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        if not isinstance(layer, LinearBase):
            return None
        if self.is_layer_skipped(prefix):
            return UnquantizedLinearMethod()
        if not self.is_checkpoint_fp8_serialized:
            return Fp8OnlineLinearMethod(self)
        return Fp8LinearMethod(self)


class Fp8LinearMethod(Fp8WeightLayout, LinearMethodBase):
    """A serialized fp8 checkpoint's linear: per-tensor `weight_scale` or
    block `weight_scale_inv`, fp8 activations (see the module docstring);
    the layout's `process_weights_after_loading` and `apply` run it."""

    def __init__(self, quant_config: Fp8Config) -> None:
        self.quant_config = quant_config
        self.weight_block_size = quant_config.weight_block_size
        self.block_quant = self.weight_block_size is not None
        self.act_q_static = quant_config.activation_scheme == "static"
        if self.block_quant:
            block = self.weight_block_size
            super().__init__("block", "group", block=block, scale_name="weight_scale_inv")
        else:
            act = "tensor" if self.act_q_static else "token"
            super().__init__("tensor", act, requantize=True)

    def create_linear_weights(self, layer: Any, spec: LinearWeightSpec) -> None:
        self.create(
            layer, spec.output_partition_sizes, spec.input_size_per_partition, spec.weight_loader
        )


class Fp8OnlineLinearMethod(UnquantizedLinearMethod):
    """`-q fp8` on an unquantized checkpoint: the dense weight is created and
    loaded as `UnquantizedLinearMethod` does, then quantized per tensor (one
    scale for the whole, possibly fused, weight, as upstream) and replaced by
    its fp8 copy; activations are quantized per token at run time. `layer` is
    typed Any: the attributes read are those `process_weights_after_loading` sets."""

    def __init__(self, quant_config: Fp8Config) -> None:
        self.quant_config = quant_config

    def process_weights_after_loading(self, layer: Any) -> None:
        qweight, scale = scaled_fp8_quant(layer.weight.data)
        n = qweight.shape[0]
        layer.weight = Parameter(qweight, requires_grad=False)
        layer.weight_scale = Parameter(scale.expand(n).reshape(n, 1).clone(), requires_grad=False)

    def apply(  # type: ignore[override]
        self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        k = layer.weight.shape[1]
        return apply_fp8_linear(x, layer.weight, layer.weight_scale, k, "token", None, bias)
