"""Quantization methods by name (upstream: vllm/model_executor/layers/quantization/__init__.py).

`QUANTIZATION_METHODS` lists the names upstream accepts for `-q/--quantization`
(and finds in a checkpoint's `quantization_config.quant_method`);
`BUILT_QUANTIZATION_METHODS` the ones this build runs. `gguf` is resolved from
a .gguf model file (it has no `quantization_config`); its `GGUFConfig` learns
the file's tensor types from the GGUF loader.
"""

from __future__ import annotations

import json
import os
from typing import Any, Literal, get_args

from vllm.model_executor.layers.quantization.base_config import (
    QuantizationConfig,
    QuantizeMethodBase,
)

QuantizationMethods = Literal[
    "awq",
    "awq_marlin",
    "bitsandbytes",
    "compressed-tensors",
    "experts_int8",
    "fbgemm_fp8",
    "fp8",
    "gguf",
    "gptq",
    "gptq_marlin",
    "gptq_marlin_24",
    "hqq",
    "inc",
    "ipex",
    "modelopt",
    "modelopt_fp4",
    "moe_wna16",
    "mxfp4",
    "ptpc_fp8",
    "quark",
    "torchao",
]
QUANTIZATION_METHODS: list[str] = list(get_args(QuantizationMethods))

# What runs here; each entry says what of the method is built.
BUILT_QUANTIZATION_METHODS: dict[str, str] = {
    "compressed-tensors": (
        "W8A16 (int8 per channel, symmetric) and W4A16 (int4 per group of 32-256, "
        "symmetric or asymmetric), pack-quantized; W8A8 int8 (dynamic per-token "
        "activations), int-quantized; FP8 weights per tensor / channel / block "
        "(W8A16-FP8, and W8A8-FP8 with dynamic per-token or static activations), "
        "float-quantized"
    ),
    "fp8": (
        "fp8 (e4m3) checkpoints, per-tensor weight_scale or weight_block_size blocks "
        "(weight_scale_inv), dynamic per-token or static activations; or -q fp8 on an "
        "unquantized checkpoint (weights quantized per tensor at load)"
    ),
    "gguf": (
        "a .gguf file given as the model, kept quantized: Q4_0, Q4_1, Q4_K (int4 kernel), "
        "Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q5_K, Q6_K (int8 group kernel); F32 / F16 / BF16 dense"
    ),
    "gptq": (
        "4-bit, group_size 32-256, GPTQ v1 / v2 zeros (checkpoint_format), desc_act "
        "false or true (act-order inputs regrouped at load)"
    ),
    "awq": "4-bit GEMM layout with zero points, group_size 32-256",
}

# Upstream's CUDA-only kernels for the same checkpoints: refused here by name,
# as upstream's CPU platform refuses them, pointing at the method that runs.
_CUDA_ONLY_ALIASES = {"gptq_marlin": "gptq", "awq_marlin": "awq", "gptq_marlin_24": None}


# Methods that also quantize an unquantized checkpoint at load (`-q fp8` on a
# bf16 model), built from their config class's defaults.
ONLINE_QUANTIZATION_METHODS = ("fp8",)


def built_methods_summary() -> str:
    """One line naming what is built, for refusals."""
    return "; ".join(f"{name}: {what}" for name, what in BUILT_QUANTIZATION_METHODS.items())


def get_quantization_config(quantization: str) -> type[QuantizationConfig]:
    """The config class of a method; a ValueError naming the method (and
    what is built) for an unknown or unbuilt one."""
    if quantization not in QUANTIZATION_METHODS:
        raise ValueError(
            f"Invalid quantization method: {quantization!r}. Known methods: {QUANTIZATION_METHODS}."
        )
    if quantization == "compressed-tensors":
        from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
            CompressedTensorsConfig,
        )

        return CompressedTensorsConfig
    if quantization == "gguf":
        from vllm.model_executor.layers.quantization.gguf import GGUFConfig

        return GGUFConfig
    if quantization == "fp8":
        from vllm.model_executor.layers.quantization.fp8 import Fp8Config

        return Fp8Config
    if quantization == "gptq":
        from vllm.model_executor.layers.quantization.gptq import GPTQConfig

        return GPTQConfig
    if quantization == "awq":
        from vllm.model_executor.layers.quantization.awq import AWQConfig

        return AWQConfig
    if quantization in _CUDA_ONLY_ALIASES:
        runs_as = _CUDA_ONLY_ALIASES[quantization]
        hint = f"; the same checkpoints run here as {runs_as!r} (-q {runs_as}, or no -q)"
        raise ValueError(
            f"Quantization method {quantization!r} needs the Marlin CUDA kernels, which are "
            f"not supported on CPU{hint if runs_as else ''}."
        )
    raise ValueError(
        f"Quantization method {quantization!r} is not built here "
        f"(built: {built_methods_summary()})."
    )


def quant_config_from_files(model_dir: str, method: str) -> dict[str, Any] | None:
    """The quantization config of a checkpoint whose config.json has none,
    read from the side file the method names (upstream's `get_quant_config`:
    AutoGPTQ's quantize_config.json, AutoAWQ's quant_config.json), for a
    method given with -q; `quant_method` is filled in when the file lacks it.
    None when `model_dir` is not a directory or holds none of those files."""
    if method not in BUILT_QUANTIZATION_METHODS or method == "gguf" or not os.path.isdir(model_dir):
        return None
    for name in get_quantization_config(method).get_config_filenames():
        path = os.path.join(model_dir, name)
        if os.path.isfile(path):
            try:
                with open(path) as f:
                    config = json.load(f)
            except (OSError, ValueError) as e:
                raise ValueError(f"Cannot read the quantization config {path!r}: {e}") from e
            if not isinstance(config, dict):
                raise ValueError(f"The quantization config {path!r} is not a JSON object.")
            return {"quant_method": method, **config}
    return None


__all__ = [
    "BUILT_QUANTIZATION_METHODS",
    "ONLINE_QUANTIZATION_METHODS",
    "QUANTIZATION_METHODS",
    "QuantizationConfig",
    "QuantizationMethods",
    "QuantizeMethodBase",
    "built_methods_summary",
    "get_quantization_config",
    "quant_config_from_files",
]
