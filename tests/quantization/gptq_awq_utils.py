"""Writes GPTQ and AWQ checkpoints of tiny models in their own layouts,
independently of vllm's readers (round-to-nearest 4-bit per group of input
columns; a twin directory holds the dequantized weights transformers runs).

GPTQ (AutoGPTQ / GPTQModel): qweight int32 [K / 8, N], input 8r + j of column n
in bits [4j, 4j + 4) of word r; qzeros int32 [G, N / 8], output 8c + j in
bits [4j, 4j + 4) of word c, storing zero - 1 (v1, "gptq") or zero ("gptq_v2");
scales [G, N]; g_idx int32 [K] (group of each input; act-order scatters them).
AWQ (AutoAWQ GEMM): qweight int32 [K, N / 8] and qzeros [G, N / 8] packed along
the outputs, nibble i of word c holding output 8c + (0, 2, 4, 6, 1, 3, 5, 7)[i];
zeros stored as is; scales [G, N]. Both: w[n, k] = (q - zero) * scale."""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import load_file, save_file

from tests.quantization.ct_utils import QUANTIZED, _copy_dir

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_INPUT_OF = {
    "q_proj": "qkv",
    "k_proj": "qkv",
    "v_proj": "qkv",
    "gate_proj": "mlp",
    "up_proj": "mlp",
}


def rtn_int4(
    w: torch.Tensor, g_idx: torch.Tensor, groups: int, symmetric: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q [N, K] 0..15, zero [G, N] 0..15, scale [G, N]) with w ~ (q - zero) * scale,
    zero[g, n] and scale[g, n] shared by the inputs k with g_idx[k] == g."""
    n = w.shape[0]
    scale, zero = torch.empty(groups, n), torch.empty(groups, n)
    q = torch.empty(w.shape, dtype=torch.int64)
    for g in range(groups):
        cols = (g_idx == g).nonzero().flatten()
        block = w[:, cols].float()
        if symmetric:
            s = (block.abs().amax(dim=1) / 7).clamp(min=1e-8)
            z = torch.full((n,), 8.0)
        else:
            lo, hi = block.amin(dim=1).clamp(max=0), block.amax(dim=1).clamp(min=0)
            s = ((hi - lo) / 15).clamp(min=1e-8)
            z = torch.clamp(torch.round(-lo / s), 1, 15)  # >= 1: v1 stores zero - 1
        q[:, cols] = torch.clamp(torch.round(block / s[:, None]) + z[:, None], 0, 15).long()
        scale[g], zero[g] = s, z
    return q, zero.long(), scale


def _words(nibbles: torch.Tensor) -> torch.Tensor:
    """int64 [..., 8] -> int32 [...]: nibble i in bits [4i, 4i + 4), as signed int32."""
    word = torch.zeros(nibbles.shape[:-1], dtype=torch.int64)
    for i in range(8):
        word |= (nibbles[..., i] & 0xF) << (4 * i)
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def pack_gptq(q: torch.Tensor, zero: torch.Tensor, v2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(qweight [K / 8, N], qzeros [G, N / 8])."""
    k, n = q.shape[1], q.shape[0]
    qweight = _words(q.t().reshape(k // 8, 8, n).permute(0, 2, 1))
    stored = zero if v2 else zero - 1
    qzeros = _words(stored.reshape(stored.shape[0], n // 8, 8))
    return qweight, qzeros


def pack_awq(q: torch.Tensor, zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(qweight [K, N / 8], qzeros [G, N / 8]) in AWQ's nibble order."""
    order = torch.tensor(AWQ_ORDER)

    def pack(t: torch.Tensor) -> torch.Tensor:  # [rows, N] -> [rows, N / 8]
        return _words(t.reshape(t.shape[0], -1, 8)[..., order])

    return pack(q.t().contiguous()), pack(zero)


def gptq_config(group: int, desc_act: bool, sym: bool, fmt: str = "gptq") -> dict:
    return {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": group,
        "desc_act": desc_act,
        "sym": sym,
        "true_sequential": True,
        "damp_percent": 0.01,
        "checkpoint_format": fmt,
        "lm_head": False,
        "static_groups": False,
    }


def awq_config(group: int) -> dict:
    return {
        "quant_method": "awq",
        "bits": 4,
        "group_size": group,
        "zero_point": True,
        "version": "gemm",
        "modules_to_not_convert": None,
    }


def _g_idx(k: int, group: int, desc_act: bool, gen: torch.Generator) -> torch.Tensor:
    """Group of each input: in order, or (act-order) by a random quantization order."""
    if not desc_act:
        return torch.arange(k) // group
    perm = torch.randperm(k, generator=gen)
    g_idx = torch.empty(k, dtype=torch.int64)
    g_idx[perm] = torch.arange(k) // group
    return g_idx


def write_quantized(
    src: str,
    dst: str,
    ref: str | None,
    method: str,
    group: int = 128,
    desc_act: bool = False,
    sym: bool = True,
    fmt: str = "gptq",
    scale_dtype: torch.dtype = torch.float16,
) -> None:
    """Quantize `src`'s linears into a `method` ("gptq" / "awq") checkpoint in
    `dst` (config.json's quantization_config); the dequantized twin in `ref`."""
    gen = torch.Generator().manual_seed(0)
    out, deq, orders = {}, {}, {}
    for name, w in load_file(os.path.join(src, "model.safetensors")).items():
        module = name.rsplit(".", 2)[-2] if name.endswith(".weight") else ""
        if module not in QUANTIZED:
            out[name] = deq[name] = w
            continue
        stem, k = name[: -len(".weight")], w.shape[1]
        # Act-order comes from the input's statistics: q / k / v (and gate /
        # up) see the same input, so GPTQ gives them the same order.
        shared = stem.rsplit(".", 1)[0] + "." + _INPUT_OF.get(module, module)
        if shared not in orders:
            orders[shared] = _g_idx(k, group, desc_act and method == "gptq", gen)
        g_idx = orders[shared]
        q, zero, scale = rtn_int4(w, g_idx, k // group, sym and method == "gptq")
        scale = scale.to(scale_dtype)
        if method == "gptq":
            qweight, qzeros = pack_gptq(q, zero, v2=fmt == "gptq_v2")
            out[f"{stem}.g_idx"] = g_idx.to(torch.int32)
        else:
            qweight, qzeros = pack_awq(q, zero)
        out.update({f"{stem}.qweight": qweight, f"{stem}.qzeros": qzeros})
        out[f"{stem}.scales"] = scale
        deq[name] = ((q - zero.t()[:, g_idx]) * scale.float().t()[:, g_idx]).to(w.dtype)
    _copy_dir(src, dst)
    save_file(out, os.path.join(dst, "model.safetensors"))
    cfg_path = os.path.join(dst, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = (
        gptq_config(group, desc_act, sym, fmt) if method == "gptq" else awq_config(group)
    )
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    if ref is not None:
        _copy_dir(src, ref)
        save_file(deq, os.path.join(ref, "model.safetensors"))
