"""compressed-tensors checkpoints: the config and the linear method
(upstream: .../compressed_tensors/compressed_tensors.py).

config.json's `quantization_config` (llm-compressor's output) looks like
  {"quant_method": "compressed-tensors", "format": "pack-quantized",
   "config_groups": {"group_0": {"targets": ["Linear"],
       "weights": {"num_bits": 4, "type": "int", "symmetric": true,
                   "strategy": "group", "group_size": 128, ...},
       "input_activations": null, ...}},
   "ignore": ["lm_head"], ...}
Each linear takes the scheme of the first group whose targets match it
("Linear", an exact module name, or "re:<regex>"), unless `ignore` names it.
Only the schemes with a CPU kernel here are accepted (`_scheme_from_group`:
W8A16 / W4A16 weight-only, W8A8 int8 with dynamic per-token activations, and
FP8 weights, weight-only or with FP8 activations: `_fp8_scheme`);
any other is refused at start-up by name, never dequantized.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

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
from vllm.model_executor.layers.quantization.compressed_tensors.schemes import (
    CompressedTensorsScheme,
    CompressedTensorsW8A8Fp8,
    CompressedTensorsW8A8Int8,
    CompressedTensorsW8A16Fp8,
    CompressedTensorsWNA16,
)
from vllm.model_executor.layers.quantization.utils.quant_utils import fused_shard_names

_WNA16_FORMATS = ("pack-quantized",)
# Formats holding fp8 weights unpacked, one float8_e4m3fn byte each.
_FP8_FORMATS = ("float-quantized", "naive-quantized")


def _matches(name: str, target: str) -> bool:
    """compressed-tensors' target rule: "re:<regex>" (re.match) or equality."""
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return name == target


def _refuse(group: str, what: str) -> ValueError:
    return ValueError(
        f"compressed-tensors config group {group!r}: {what} is not built here "
        "(built: pack-quantized W8A16 int8 per channel and W4A16 int4 per group, "
        "symmetric or asymmetric; int-quantized W8A8 int8 per channel with dynamic "
        "per-token activations; float-quantized FP8 weights per tensor, channel or "
        "block, weight-only or with dynamic per-token / static per-tensor FP8 "
        "activations)."
    )


def _scheme_from_group(
    name: str, group: dict[str, Any], fmt: str | None
) -> CompressedTensorsScheme:
    """The scheme of one config group, or a ValueError naming what is not built."""
    fmt = group.get("format") or fmt
    weights = group.get("weights")
    if group.get("output_activations") is not None:
        raise _refuse(name, "output activation quantization")
    if not weights:
        raise _refuse(name, "a group without weight quantization")
    if weights.get("type", "int") == "float":
        return _fp8_scheme(name, weights, group.get("input_activations"), fmt)
    if weights.get("type", "int") != "int":
        raise _refuse(name, f"weights of type {weights.get('type')!r} (FP8 weights)")
    if weights.get("dynamic"):
        raise _refuse(name, "dynamic weight quantization")
    if weights.get("actorder") not in (None, False):
        raise _refuse(name, f"actorder={weights.get('actorder')!r}")
    if group.get("input_activations") is not None:
        return _w8a8_scheme(name, weights, group["input_activations"], fmt)
    if fmt not in _WNA16_FORMATS:
        raise _refuse(name, f"format {fmt!r} for weight-only quantization")
    bits, strategy = weights.get("num_bits"), weights.get("strategy")
    try:
        return CompressedTensorsWNA16(
            str(strategy),
            int(bits or 0),
            weights.get("group_size"),
            symmetric=bool(weights.get("symmetric", True)),
        )
    except ValueError as e:
        raise _refuse(name, str(e)) from None


def _w8a8_scheme(
    name: str, weights: dict[str, Any], acts: dict[str, Any], fmt: str | None
) -> CompressedTensorsW8A8Int8:
    """W8A8 int8: int8 per-channel symmetric weights ("int-quantized") and
    dynamic symmetric per-token int8 activations; anything else is refused."""
    if acts.get("type", "int") != "int":
        raise _refuse(name, f"activations of type {acts.get('type')!r} (FP8 W8A8)")
    if acts.get("num_bits") != 8 or weights.get("num_bits") != 8:
        raise _refuse(
            name, f"W{weights.get('num_bits')}A{acts.get('num_bits')} activation quantization"
        )
    if not acts.get("dynamic"):
        raise _refuse(name, "static activation quantization (input_scale)")
    if not acts.get("symmetric", True) or not weights.get("symmetric", True):
        raise _refuse(name, "asymmetric W8A8")
    if acts.get("strategy", "token") != "token" or weights.get("strategy") != "channel":
        raise _refuse(
            name,
            f"W8A8 with weight strategy {weights.get('strategy')!r} and activation strategy "
            f"{acts.get('strategy')!r} (built: channel / token)",
        )
    if fmt != "int-quantized":
        raise _refuse(name, f"W8A8 in format {fmt!r}")
    return CompressedTensorsW8A8Int8()


def _fp8_scheme(
    name: str, weights: dict[str, Any], acts: dict[str, Any] | None, fmt: str | None
) -> CompressedTensorsScheme:
    """FP8 weights (upstream's _is_fp8_w8a16 / _is_fp8_w8a8): 8-bit float,
    symmetric, static, per tensor / channel / block; activations none
    (W8A16-FP8), or 8-bit float symmetric, dynamic (per token; per token
    group for block weights, as upstream) or static per tensor (W8A8-FP8)."""
    strategy = weights.get("strategy")
    if weights.get("num_bits") != 8:
        raise _refuse(name, f"float weights of {weights.get('num_bits')} bits (FP4 / MXFP)")
    if strategy not in ("tensor", "channel", "block"):
        raise _refuse(name, f"FP8 weights with strategy {strategy!r}")
    if weights.get("dynamic") or not weights.get("symmetric", True):
        raise _refuse(name, "dynamic or asymmetric FP8 weights")
    block = weights.get("block_structure") if strategy == "block" else None
    if strategy == "block" and (not isinstance(block, list) or len(block) != 2):
        raise _refuse(name, f"FP8 block weights with block_structure {block!r}")
    if fmt not in _FP8_FORMATS:
        raise _refuse(name, f"FP8 weights in format {fmt!r}")
    if acts is None:
        return CompressedTensorsW8A16Fp8(strategy, block)
    if acts.get("type") != "float" or acts.get("num_bits") != 8:
        raise _refuse(
            name, f"FP8 weights with {acts.get('type')} {acts.get('num_bits')}-bit activations"
        )
    if not acts.get("symmetric", True):
        raise _refuse(name, "asymmetric FP8 activations")
    static = not acts.get("dynamic")
    if static and (acts.get("strategy") != "tensor" or block is not None):
        raise _refuse(
            name,
            f"static FP8 activations with strategy {acts.get('strategy')!r} and weight "
            f"strategy {strategy!r} (built: static per tensor, non-block weights)",
        )
    return CompressedTensorsW8A8Fp8(strategy, static, block)


class CompressedTensorsConfig(CPUQuantizationConfig):
    """The parsed `quantization_config` of a compressed-tensors checkpoint."""

    def __init__(
        self,
        target_scheme_map: dict[str, CompressedTensorsScheme],
        targets_by_group: dict[str, list[str]],
        ignore: list[str],
    ) -> None:
        super().__init__()
        self.target_scheme_map = target_scheme_map
        self.targets_by_group = targets_by_group
        self.ignore = ignore

    def get_name(self) -> str:
        return "compressed-tensors"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> CompressedTensorsConfig:
        if config.get("kv_cache_scheme") is not None:
            raise ValueError(
                "compressed-tensors kv_cache_scheme (a quantized KV cache) is not built."
            )
        sparsity = config.get("sparsity_config") or {}
        if sparsity.get("format") not in (None, "dense"):
            raise ValueError(
                f"compressed-tensors sparsity format {sparsity.get('format')!r} is not built."
            )
        if config.get("transform_config"):
            raise ValueError("compressed-tensors transform_config (rotations) is not built.")
        groups = config.get("config_groups") or {}
        if not groups:
            raise ValueError("compressed-tensors quantization_config has no config_groups.")
        fmt = config.get("format")
        schemes, targets = {}, {}
        for name, group in groups.items():
            schemes[name] = _scheme_from_group(name, group, fmt)
            targets[name] = list(group.get("targets") or [])
        return cls(schemes, targets, list(config.get("ignore") or []))

    def _scheme_for(self, name: str) -> str | None:
        """The config group of one checkpoint module (None: not quantized)."""
        if any(_matches(name, target) for target in self.ignore):
            return None
        for group, targets in self.targets_by_group.items():
            if any(t == "Linear" or _matches(name, t) for t in targets):
                return group
        return None

    def get_scheme(self, layer: nn.Module, prefix: str) -> CompressedTensorsScheme | None:
        """The layer's scheme; the shards of a fused layer must agree."""
        groups = {
            self._scheme_for(name)
            for name in fused_shard_names(prefix, self.packed_modules_mapping)
        }
        if len(groups) > 1:
            raise ValueError(
                f"compressed-tensors: the parts of fused layer {prefix!r} are quantized "
                f"differently ({sorted(map(str, groups))}); this is not supported."
            )
        group = groups.pop()
        return None if group is None else self.target_scheme_map[group]

    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        if not isinstance(layer, LinearBase):
            return None
        scheme = self.get_scheme(layer, prefix)
        if scheme is None:
            return UnquantizedLinearMethod()
        return CompressedTensorsLinearMethod(scheme)


class CompressedTensorsLinearMethod(LinearMethodBase):
    """Delegates a linear layer's weights to its scheme."""

    def __init__(self, scheme: CompressedTensorsScheme) -> None:
        self.scheme = scheme

    def create_linear_weights(self, layer: nn.Module, spec: LinearWeightSpec) -> None:
        self.scheme.create_linear_weights(layer, spec)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        self.scheme.process_weights_after_loading(layer)

    def apply(  # type: ignore[override]
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.scheme.apply_weights(layer, x, bias)
