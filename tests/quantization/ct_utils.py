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


# ---- FP8 (float8_e4m3fn) checkpoints: compressed-tensors and upstream's "fp8" ----

E4M3_MAX = 448.0
FUSED = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gu", "up_proj": "gu"}


def fp8_quantize(
    w: torch.Tensor, strategy: str, block: tuple[int, int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q float8_e4m3fn [N, K], float32 scale) with w ~ float(q) * scale;
    scale [1] ("tensor"), [N, 1] ("channel") or [ceil(N/bn), ceil(K/bk)]
    ("block"), each max|w| / 448 over its elements (minmax observer)."""
    w = w.float()
    n, k = w.shape
    if strategy == "block":
        bn, bk = block
        pad = torch.zeros(-(-n // bn) * bn, -(-k // bk) * bk)
        pad[:n, :k] = w
        blocks = pad.reshape(pad.shape[0] // bn, bn, pad.shape[1] // bk, bk)
        scale = blocks.abs().amax(dim=(1, 3)) / E4M3_MAX
        full = scale.repeat_interleave(bn, 0).repeat_interleave(bk, 1)[:n, :k]
    else:
        amax = w.abs().amax().reshape(1) if strategy == "tensor" else w.abs().amax(1, keepdim=True)
        scale = amax / E4M3_MAX
        full = scale
    q = (w / full).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def fp8_dequantize(q: torch.Tensor, scale: torch.Tensor, block=None) -> torch.Tensor:
    n, k = q.shape
    if block is not None:
        scale = scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:n, :k]
    return q.float() * scale.float()


def _fp8_layer_tensors(weights: dict, strategy: str, block) -> tuple[dict, dict, dict]:
    """Quantize every QUANTIZED linear: (q, scale) per module stem, and the
    stems grouped by the fused layer they end up in."""
    quant, fused = {}, {}
    for name, w in weights.items():
        module = name.rsplit(".", 2)[-2] if name.endswith(".weight") else ""
        if module in QUANTIZED:
            stem = name[: -len(".weight")]
            quant[stem] = fp8_quantize(w, strategy, block)
            key = (stem.rsplit(".", 1)[0], FUSED.get(module, module))
            fused.setdefault(key, []).append(stem)
    return quant, fused, {}


def _requantized(quant: dict, fused: dict) -> dict:
    """The weights a fused per-tensor layer runs with: each part's
    fp8(float(q_i) * s_i / S), S = max s_i over the fused parts (upstream's
    requantize_with_max_scale), dequantized with S."""
    out = {}
    for stems in fused.values():
        big = torch.stack([quant[s][1].reshape(()) for s in stems]).max()
        for s in stems:
            q, scale = quant[s]
            q2 = (q.float() * scale.reshape(()) / big).clamp(-E4M3_MAX, E4M3_MAX)
            out[s] = q2.to(torch.float8_e4m3fn).float() * big
    return out


def calibrate_input_scales(src: str, prompts: list[list[int]]) -> dict[str, float]:
    """Static activation scales: max |input| / 448 of each quantized linear
    over `prompts`, run through transformers on `src`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    amax: dict[str, float] = {}

    def hook(name):
        def record(module, args):
            amax[name] = max(amax.get(name, 0.0), float(args[0].abs().max()))

        return record

    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in QUANTIZED:
            module.register_forward_pre_hook(hook(name))
    with torch.no_grad():
        for ids in prompts:
            model(torch.tensor([ids]))
    return {name: a / E4M3_MAX for name, a in amax.items()}


def fp8_config(method: str, strategy: str, acts: str | None, block=None, fmt=None) -> dict:
    """quantization_config of an FP8 checkpoint: compressed-tensors (acts
    None: W8A16-FP8; "dynamic": FP8_DYNAMIC-like; "static": FP8) or
    upstream's "fp8" method (per tensor, or weight_block_size)."""
    if method == "fp8":
        cfg = {"quant_method": "fp8", "activation_scheme": acts or "dynamic"}
        if block is not None:
            cfg.update(weight_block_size=list(block), fmt="e4m3")
        return cfg
    cfg = quantization_config(8, None)
    group = cfg["config_groups"]["group_0"]
    group["weights"].update(type="float", strategy=strategy, group_size=None, observer="minmax")
    if block is not None:
        group["weights"]["block_structure"] = list(block)
    if acts is not None:
        group["input_activations"] = {
            "num_bits": 8,
            "type": "float",
            "symmetric": True,
            "strategy": "tensor" if acts == "static" else ("group" if block else "token"),
            "group_size": block[1] if block and acts == "dynamic" else None,
            "dynamic": acts == "dynamic",
            "observer": "minmax" if acts == "static" else None,
        }
    cfg["format"] = group["format"] = fmt or "float-quantized"
    return cfg


def write_fp8(
    src: str,
    dst: str,
    ref: str | None,
    method: str = "compressed-tensors",
    strategy: str = "channel",
    acts: str | None = None,
    block=None,
    input_scales: dict[str, float] | None = None,
    fmt: str | None = None,
) -> None:
    """`src` as an FP8 checkpoint in `dst` (float8_e4m3fn `weight`, and
    `weight_scale`, or `weight_scale_inv` for the fp8 method's blocks,
    `input_scale` for static activations); `ref` gets the weights the engine
    runs with, dequantized (fused per-tensor parts requantized to their max
    scale where the engine does so: W8A8 / the fp8 method)."""
    weights = load_file(os.path.join(src, "model.safetensors"))
    quant, fused, _ = _fp8_layer_tensors(weights, strategy, block)
    requant = strategy == "tensor" and (acts is not None or method == "fp8")
    deq = _requantized(quant, fused) if requant else {}
    out, ref_t = {}, {}
    scale_name = "weight_scale_inv" if method == "fp8" and block else "weight_scale"
    for name, w in weights.items():
        stem = name[: -len(".weight")]
        if stem not in quant:
            out[name] = ref_t[name] = w
            continue
        q, scale = quant[stem]
        out[name] = q
        out[f"{stem}.{scale_name}"] = scale.reshape(()) if method == "fp8" and not block else scale
        if acts == "static":
            out[f"{stem}.input_scale"] = torch.tensor([input_scales[stem]], dtype=torch.float32)
        ref_t[name] = deq[stem] if stem in deq else fp8_dequantize(q, scale, block)
    _copy_dir(src, dst)
    save_file(out, os.path.join(dst, "model.safetensors"))
    cfg_path = os.path.join(dst, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = fp8_config(method, strategy, acts, block, fmt)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    if ref is not None:
        _copy_dir(src, ref)
        save_file(ref_t, os.path.join(ref, "model.safetensors"))


def fused_input_scales(input_scales: dict[str, float]) -> dict[str, float]:
    """Each module's static input scale as the engine uses it: the largest
    over the fused layer it belongs to (q/k/v, gate/up)."""
    out = {}
    for name, s in input_scales.items():
        head, module = name.rsplit(".", 1)
        kin = FUSED.get(module)
        parts = [m for m, k in FUSED.items() if k == kin] if kin else [module]
        out[name] = max(input_scales[f"{head}.{m}"] for m in parts)
    return out


def hf_fp8_act_quant_model(model_dir: str, act: str, input_scales=None, group: int = 128):
    """transformers on `model_dir` with each quantized linear's input
    fake-quantized to e4m3 as W8A8-FP8 does: per token (s = max(max|x_row|
    / 448, 1 / (448 * 512))), per token and `group` columns (s = max(max|x|,
    1e-10) / 448), or with a static per-module scale; x -> float(q) * s."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def quant(x, s):
        return (x / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * s

    def hook(name):
        def fake_quant(module, args):
            x = args[0].float()
            if act == "static":
                return (quant(x, torch.tensor(input_scales[name])),)
            if act == "group":
                g = x.reshape(*x.shape[:-1], -1, group)
                s = g.abs().amax(-1, keepdim=True).clamp(min=1e-10) / E4M3_MAX
                return (quant(g, s).reshape(x.shape),)
            s = (x.abs().amax(-1, keepdim=True) / E4M3_MAX).clamp(min=1 / (E4M3_MAX * 512))
            return (quant(x, s),)

        return fake_quant

    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in QUANTIZED:
            module.register_forward_pre_hook(hook(name))
    return model
