"""Writes compressed-tensors checkpoints of tiny models, as llm-compressor
lays them out (pack-quantized), independently of vllm's reader: each linear's
weight is quantized symmetric (per output channel, or per group of input
columns), offset-coded (q + 2**(bits-1)) and packed 32/bits values per int32,
value j of a word in bits [j*bits, (j+1)*bits). A twin directory holds the
dequantized weights (q * scale), the reference transformers runs."""

from __future__ import annotations

import json
import os
import re
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
    q, scale, _ = quantize_asym(w, bits, group, symmetric=True)
    return q, scale


def quantize_asym(
    w: torch.Tensor, bits: int, group: int | None, symmetric: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, scale, zp) with w ~ (q - zp) * scale, q and zp signed int8 in
    [-2**(bits-1), 2**(bits-1)); zp = 0 when symmetric (min/max observer)."""
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    n, k = w.shape
    g = group or k
    blocks = w.float().reshape(n, k // g, g)
    if symmetric:
        scale = (blocks.abs().amax(dim=-1) / qmax).clamp(min=1e-8)
        zp = torch.zeros_like(scale)
    else:
        lo = blocks.amin(dim=-1).clamp(max=0)
        hi = blocks.amax(dim=-1).clamp(min=0)
        scale = ((hi - lo) / (qmax - qmin)).clamp(min=1e-8)
        zp = torch.clamp(torch.round(-lo / scale) + qmin, qmin, qmax)
    q = torch.clamp(torch.round(blocks / scale.unsqueeze(-1)) + zp.unsqueeze(-1), qmin, qmax)
    return q.reshape(n, k).to(torch.int8), scale, zp.to(torch.int8)


def dequantize(
    q: torch.Tensor, scale: torch.Tensor, zp: torch.Tensor | None = None
) -> torch.Tensor:
    n, k = q.shape
    g = k // scale.shape[1]
    zp = torch.zeros_like(scale) if zp is None else zp.float()
    blocks = q.float().reshape(n, -1, g) - zp.unsqueeze(-1)
    return (blocks * scale.float().unsqueeze(-1)).reshape(n, k)


def pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    """int8 [N, K] -> int32 [N, K * bits / 32], one word at a time."""
    per_word = 32 // bits
    u = (q.to(torch.int64) + (1 << (bits - 1))).reshape(q.shape[0], -1, per_word)
    words = torch.zeros(u.shape[:2], dtype=torch.int64)
    for j in range(per_word):
        words |= u[..., j] << (bits * j)
    words = torch.where(words >= 2**31, words - 2**32, words)  # as signed int32
    return words.to(torch.int32)


def quantization_config(
    bits: int, group: int | None, symmetric: bool = True, **weights_extra
) -> dict:
    weights = {
        "num_bits": bits,
        "type": "int",
        "symmetric": symmetric,
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
    ignore: tuple[str, ...] = (),
    symmetric: bool = True,
) -> None:
    """Quantize `src` (an HF checkpoint dir) into `dst`; the dequantized twin
    into `ref`. Modules matching an `ignore` regex stay dense (and are listed
    as "re:<regex>" in the config's ignore list, as llm-compressor does)."""
    weights = load_file(os.path.join(src, "model.safetensors"))
    out, deq = {}, {}
    for name, w in weights.items():
        module = name.rsplit(".", 2)[-2] if name.endswith(".weight") else ""
        stem = name[: -len(".weight")]
        if module not in QUANTIZED or any(re.match(p, stem) for p in ignore):
            out[name] = deq[name] = w
            continue
        q, scale, zp = quantize_asym(w, bits, group, symmetric)
        scale = scale.to(scale_dtype)
        out[f"{stem}.weight_packed"] = pack(q, bits)
        out[f"{stem}.weight_scale"] = scale
        out[f"{stem}.weight_shape"] = torch.tensor(list(w.shape), dtype=torch.int64)
        if not symmetric:  # packed along the output dim: [N * bits / 32, groups]
            out[f"{stem}.weight_zero_point"] = pack(zp.t().contiguous(), bits).t().contiguous()
        deq[name] = dequantize(q, scale, None if symmetric else zp).to(w.dtype)
    _copy_dir(src, dst)
    save_file(out, os.path.join(dst, "model.safetensors"))
    cfg_path = os.path.join(dst, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = quantization_config(bits, group, symmetric)
    cfg["quantization_config"]["ignore"] += [f"re:{p}" for p in ignore]
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    if ref is not None:
        _copy_dir(src, ref)
        save_file(deq, os.path.join(ref, "model.safetensors"))


def w8a8_quantization_config() -> dict:
    """llm-compressor's W8A8 int8 preset: int8 per-channel weights stored
    unpacked ("int-quantized"), dynamic per-token int8 activations."""
    cfg = quantization_config(8, None)
    group = cfg["config_groups"]["group_0"]
    group["input_activations"] = {
        "num_bits": 8,
        "type": "int",
        "symmetric": True,
        "strategy": "token",
        "dynamic": True,
        "observer": None,
    }
    cfg["format"] = group["format"] = "int-quantized"
    return cfg


def write_w8a8(src: str, dst: str, ref: str) -> None:
    """`src` as a W8A8 int8 checkpoint in `dst` (int8 `weight`, `weight_scale`
    [N, 1]); its dequantized weights in `ref`."""
    weights = load_file(os.path.join(src, "model.safetensors"))
    out, deq = {}, {}
    for name, w in weights.items():
        module = name.rsplit(".", 2)[-2] if name.endswith(".weight") else ""
        if module not in QUANTIZED:
            out[name] = deq[name] = w
            continue
        q, scale = quantize(w, 8, None)
        out[name] = q
        out[name.replace(".weight", ".weight_scale")] = scale
        deq[name] = dequantize(q, scale).to(w.dtype)
    for d, tensors in ((dst, out), (ref, deq)):
        _copy_dir(src, d)
        save_file(tensors, os.path.join(d, "model.safetensors"))
    cfg_path = os.path.join(dst, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = w8a8_quantization_config()
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)


def hf_act_quant_model(model_dir: str):
    """transformers' model with every quantized linear's input fake-quantized
    per token to int8 (symmetric: round(x / s) * s with s = max|x_row| / 127),
    i.e. W8A8 run in float on one device. (At TP=2 each rank quantizes its
    own slice of a row-parallel layer's input, with its own scale, as
    upstream does: not this emulation.)"""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def fake_quant(module, args):
        x = args[0].float()
        s = (x.abs().amax(dim=-1, keepdim=True) / 127.0).clamp(min=1e-10)
        return (torch.round(x / s).clamp(-128, 127) * s,)

    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in QUANTIZED:
            module.register_forward_pre_hook(fake_quant)
    return model


def greedy(model, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    outs = []
    with torch.no_grad():
        for ids in prompts:
            y = model.generate(
                torch.tensor([ids]),
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
            outs.append(y[0, len(ids) :].tolist())
    return outs


def tie_margins(model, prompts, got, want) -> list[float]:
    """For each sequence where `got` parts from `want`: the reference's logit
    of its own token minus that of `got`'s, at the first differing position
    (teacher-forced on the common prefix); small means a near-tie."""
    margins = []
    with torch.no_grad():
        for ids, g, w in zip(prompts, got, want):
            if g == w:
                continue
            j = next(i for i, (a, b) in enumerate(zip(g, w)) if a != b)
            logits = model(torch.tensor([ids + w[:j]])).logits[0, -1]
            margins.append(float(logits[w[j]] - logits[g[j]]))
    return margins
