"""Writes compressed-tensors checkpoints of tiny models, as llm-compressor
lays them out (pack-quantized), independently of vllm's reader: each linear's
weight is quantized symmetric (per output channel, or per group of input
columns), offset-coded (q + 2**(bits-1)) and packed 32/bits values per int32,
value j of a word in bits [j*bits, (j+1)*bits). A twin directory holds the
dequantized weights (q * scale), the reference transformers runs."""

from __future__ import annotations

import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

QUANTIZED = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)


def quantize(w: torch.Tensor, bits: int, group: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [N, K], scale [N, K // group] or [N, 1]) with w ~ q * scale."""
    qmax = 2 ** (bits - 1) - 1
    n, k = w.shape
    g = group or k
    blocks = w.float().reshape(n, k // g, g)
    scale = (blocks.abs().amax(dim=-1) / qmax).clamp(min=1e-8)
    q = torch.clamp(torch.round(blocks / scale.unsqueeze(-1)), -qmax - 1, qmax)
    return q.reshape(n, k).to(torch.int8), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    n, k = q.shape
    g = k // scale.shape[1]
    return (q.float().reshape(n, -1, g) * scale.float().unsqueeze(-1)).reshape(n, k)


def pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    """int8 [N, K] -> int32 [N, K * bits / 32], one word at a time."""
    per_word = 32 // bits
    u = (q.to(torch.int64) + (1 << (bits - 1))).reshape(q.shape[0], -1, per_word)
    words = torch.zeros(u.shape[:2], dtype=torch.int64)
    for j in range(per_word):
        words |= u[..., j] << (bits * j)
    words = torch.where(words >= 2**31, words - 2**32, words)  # as signed int32
    return words.to(torch.int32)


def quantization_config(bits: int, group: int | None, **weights_extra) -> dict:
    weights = {
        "num_bits": bits,
        "type": "int",
        "symmetric": True,
        "strategy": "group" if group else "channel",
        "group_size": group,
        "dynamic": False,
        "actorder": None,
        "observer": "minmax",
        **weights_extra,
    }
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": weights,
                "input_activations": None,
                "output_activations": None,
                "format": "pack-quantized",
            }
        },
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "sparsity_config": {},
    }


def _copy_dir(src: str, dst: str) -> None:
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        if not name.endswith(".safetensors"):
            shutil.copy(os.path.join(src, name), dst)


def write_compressed(
    src: str,
    dst: str,
    ref: str | None,
    bits: int,
    group: int | None,
    scale_dtype: torch.dtype = torch.float32,
) -> None:
    """Quantize `src` (an HF checkpoint dir) into `dst`; the dequantized twin into `ref`."""
    weights = load_file(os.path.join(src, "model.safetensors"))
    out, deq = {}, {}
    for name, w in weights.items():
        module = name.rsplit(".", 2)[-2] if name.endswith(".weight") else ""
        if module not in QUANTIZED:
            out[name] = deq[name] = w
            continue
        q, scale = quantize(w, bits, group)
        stem = name[: -len(".weight")]
        out[f"{stem}.weight_packed"] = pack(q, bits)
        out[f"{stem}.weight_scale"] = scale.to(scale_dtype)
        out[f"{stem}.weight_shape"] = torch.tensor(list(w.shape), dtype=torch.int64)
        deq[name] = dequantize(q, scale.to(scale_dtype)).to(w.dtype)
    _copy_dir(src, dst)
    save_file(out, os.path.join(dst, "model.safetensors"))
    cfg_path = os.path.join(dst, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = quantization_config(bits, group)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    if ref is not None:
        _copy_dir(src, ref)
        save_file(deq, os.path.join(ref, "model.safetensors"))
