"""Bit-packing helpers shared by the quantization methods (upstream:
vllm/model_executor/layers/quantization/utils/quant_utils.py).

Packing convention used throughout: an int32 word holds 32 / bits values, value j
of the word in bits [j * bits, (j + 1) * bits) (little-endian nibble order). AWQ
permutes the values inside a word on top of this (see awq.py).
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch


def unpack_from_int32(packed: torch.Tensor, num_bits: int, cols: int) -> torch.Tensor:
    """The unsigned values of an int32 tensor packed along its LAST dim:
    [rows, ceil(cols * bits / 32)] -> int32 [rows, cols] in [0, 2**bits)."""
    pack_factor = 32 // num_bits
    shifts = torch.arange(pack_factor, dtype=torch.int32, device=packed.device) * num_bits
    values = (packed.to(torch.int32).unsqueeze(-1) >> shifts) & ((1 << num_bits) - 1)
    return values.reshape(packed.shape[0], -1)[:, :cols].contiguous()


def pack_into_int32(values: torch.Tensor, num_bits: int) -> torch.Tensor:
    """The inverse of `unpack_from_int32`: int [rows, cols] in [0, 2**bits), cols a
    multiple of 32 / bits -> int32 [rows, cols * bits / 32] (wrapping into the
    sign bit as the checkpoints store it)."""
    pack_factor = 32 // num_bits
    rows, cols = values.shape
    if cols % pack_factor:
        raise ValueError(f"{cols} columns do not fill whole int32 words of {pack_factor} values.")
    shifts = torch.arange(pack_factor, dtype=torch.int64, device=values.device) * num_bits
    grouped = values.to(torch.int64).reshape(rows, cols // pack_factor, pack_factor)
    words = (grouped << shifts).sum(dim=-1)
    # Back to signed 32-bit: values >= 2**31 wrap as int32 arithmetic does.
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32)


def quant_config_from_files(model_dir: str, method: str) -> dict[str, Any] | None:
    """The quantization config of a checkpoint whose config.json has none,
    read from the side file the method names (upstream's `get_quant_config`:
    AutoGPTQ's quantize_config.json, AutoAWQ's quant_config.json), for a
    method given with -q; `quant_method` is filled in when the file lacks it.
    None when `model_dir` is not a directory or holds none of those files."""
    from vllm.model_executor.layers.quantization import (
        BUILT_QUANTIZATION_METHODS,
        get_quantization_config,
    )

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
