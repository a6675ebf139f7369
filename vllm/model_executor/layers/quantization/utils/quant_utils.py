"""Bit-packing and layer-selection helpers shared by the quantization methods (upstream:
vllm/model_executor/layers/quantization/utils/quant_utils.py).

Packing convention used throughout: an int32 word holds 32 / bits values, value j
of the word in bits [j * bits, (j + 1) * bits) (little-endian nibble order). AWQ
permutes the values inside a word on top of this (see awq.py).
"""

from __future__ import annotations

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


def fused_shard_names(prefix: str, fused_mapping: dict[str, list[str]]) -> list[str]:
    """The checkpoint modules a (possibly fused) layer stands for:
    "m.qkv_proj" with {"qkv_proj": ["q_proj", "k_proj", "v_proj"]} ->
    ["m.q_proj", "m.k_proj", "m.v_proj"]; an unfused layer -> [prefix]."""
    head, _, last = prefix.rpartition(".")
    parts = fused_mapping.get(last)
    if not parts:
        return [prefix]
    return [f"{head}.{part}" if head else part for part in parts]


def is_layer_skipped(
    prefix: str, ignored_layers: list[str], fused_mapping: dict[str, list[str]]
) -> bool:
    """Whether `ignored_layers` (exact module names) names the layer `prefix`;
    the parts of a fused layer must agree (a ValueError if not)."""
    skipped = {name in ignored_layers for name in fused_shard_names(prefix, fused_mapping)}
    if len(skipped) > 1:
        raise ValueError(
            f"Detected some but not all shards of {prefix} are quantized. All shards "
            "of fused layers to have the same precision."
        )
    return skipped.pop()
