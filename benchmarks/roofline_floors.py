"""The machine's limits and the workload's floors for benchmark_roofline.py (issue 21
item 3): the model's linear shapes from its config.json, torch's best GEMM time at each
shape and the memory bandwidth measured here, and the per-pass roofline of the workload.
How each figure is measured and counted: benchmark_roofline.py's docstring."""

from __future__ import annotations

import json
import math
import os
import platform
import struct
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

# Rows of the slices a prefill chunk's GEMM is timed on (see measure_gemms).
PREFILL_SLICE = 256


@dataclass
class Linear:
    """One linear layer shape: y[M, N] = x[M, K] @ w[N, K]^T, `count` per model."""

    name: str
    k: int
    n: int
    count: int


@dataclass
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    linears: list[Linear]  # body linears (per layer x layers) and the LM head
    params: int  # every parameter the config implies
    embed_params: int

    def linear_params(self) -> int:
        return sum(lin.k * lin.n * lin.count for lin in self.linears)

    def kv_elems_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim  # K and V, every layer


@dataclass
class Workload:
    num_prompts: int
    input_len: int
    output_len: int
    budget: int  # max_num_batched_tokens: prompt tokens per prefill pass


@dataclass
class Floors:
    compute_s: float  # sum over passes of the compute time alone
    memory_s: float  # sum over passes of the memory time alone
    roofline_s: float  # sum over passes of max(compute, memory)
    binding: str  # per phase: which side is larger ("prefill compute, decode memory")
    flops: float
    bytes: float
    passes: int
    per_phase: dict[str, dict[str, float]] = field(default_factory=dict)


def model_shape(model_dir: str) -> ModelShape:
    """The linear shapes of a Llama/Qwen2-layout decoder from its config.json."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    h, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim") or h // heads
    inter, vocab = cfg["intermediate_size"], cfg["vocab_size"]
    qkv_n = (heads + 2 * kv_heads) * head_dim
    linears = [
        Linear("qkv_proj", h, qkv_n, layers),
        Linear("o_proj", heads * head_dim, h, layers),
        Linear("gate_up_proj", h, 2 * inter, layers),
        Linear("down_proj", inter, h, layers),
        Linear("lm_head", h, vocab, 1),
    ]
    # Qwen2 has q/k/v biases; norms: two per layer and the final one.
    bias = qkv_n * layers if cfg.get("model_type") == "qwen2" else 0
    norms = (2 * layers + 1) * h
    embed = vocab * h
    tied = cfg.get("tie_word_embeddings", False)
    body = sum(lin.k * lin.n * lin.count for lin in linears[:-1])
    params = body + bias + norms + embed + (0 if tied else vocab * h)
    return ModelShape(layers, h, heads, kv_heads, head_dim, vocab, linears, params, embed)


def checkpoint_params(model_dir: str) -> int | None:
    """Parameter count from the safetensors headers (cross-checks model_shape)."""
    files = [f for f in os.listdir(model_dir) if f.endswith(".safetensors")]
    if not files:
        return None
    total = 0
    for name in files:
        with open(os.path.join(model_dir, name), "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    return total


def _best_time(fn, reps: int, min_s: float = 0.3, warmup: int = 2) -> float:
    """Best time of `fn` over at least `reps` calls and `min_s` seconds: on a shared
    machine only the best call shows what the hardware does."""
    for _ in range(warmup):
        fn()
    best, t_end, n = math.inf, time.perf_counter() + min_s, 0
    while n < reps or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        n += 1
    return best


def _packed_forms(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """The packed forms the engine's CPU GEMMs take for w: oneDNN's layout, and
    panels where the compiled panel GEMM is loaded (layers/utils.py)."""
    from vllm import _custom_ops as ops
    from vllm.model_executor.layers.utils import pack_weight_for_cpu

    forms: dict[str, torch.Tensor] = {}
    saved = os.environ.get("VLLM_CPU_GEMM")
    try:
        os.environ["VLLM_CPU_GEMM"] = "onednn"
        if (packed := pack_weight_for_cpu(w)) is not None:
            forms["onednn"] = packed
        if w.dtype in ops.PANEL_DTYPES and ops.panel_gemm_available() and w.shape[0] % 16 == 0:
            forms["panel"] = ops.pack_panels(w)
    finally:
        if saved is None:
            os.environ.pop("VLLM_CPU_GEMM", None)
        else:
            os.environ["VLLM_CPU_GEMM"] = saved
    return forms


def gemm_seconds(m: int, k: int, n: int, dtype: torch.dtype, reps: int) -> dict[str, float]:
    """Best seconds of one x[M, K] @ w[N, K]^T, dense (`F.linear`) and with each packed
    weight the engine's CPU path can use (oneDNN's, our panels), at the engines'
    thread count and at one thread. "best_s" is the floor's figure: the fastest of these,
    the one-thread time divided by the thread count (perfect scaling: on a loaded machine
    the one-thread run is the steadier measure, and a floor must not exceed what the
    cores can do)."""
    from vllm.model_executor.layers.utils import packed_linear

    x, w = torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype)
    forms = _packed_forms(w)
    threads = torch.get_num_threads()
    out: dict[str, float] = {}
    with torch.inference_mode():
        for t in sorted({threads, 1}, reverse=True):
            torch.set_num_threads(t)
            out[f"dense_t{t}"] = _best_time(lambda: F.linear(x, w), reps)
            for name, packed in forms.items():
                out[f"{name}_t{t}"] = _best_time(lambda p=packed: packed_linear(x, p, None), reps)
        torch.set_num_threads(threads)
    scaled = [v / threads if k.endswith("_t1") else v for k, v in out.items()]
    out["best_s"] = min(scaled)
    return out


def measure_gemms(shape: ModelShape, wl: Workload, dtype: torch.dtype, reps: int) -> dict:
    """gemm_seconds of each linear at the decode and the prefill row counts."""
    chunk = min(wl.budget, wl.num_prompts * wl.input_len)
    # A prefill chunk's GEMM is timed on PREFILL_SLICE-row slices and scaled up: a
    # 4096-row call (~0.1-0.2 s) is preempted every time on a shared machine, while
    # a slice's best call runs undisturbed (one core, bf16, load 5: 4096 rows 238
    # GFLOP/s, 256 rows 424); oneDNN's blocking is far below 256 rows.
    rows = {"decode": wl.num_prompts, "prefill": min(PREFILL_SLICE, chunk)}
    out: dict[str, dict[str, dict[str, float]]] = {}
    for phase, m in rows.items():
        out[phase] = {}
        for lin in shape.linears:
            # Prefill samples only the last row of each prompt: the LM head runs at decode rows.
            rows_here = wl.num_prompts if lin.name == "lm_head" else m
            t = gemm_seconds(rows_here, lin.k, lin.n, dtype, reps)
            if lin.name != "lm_head" and phase == "prefill":
                t = {k: v * chunk / m for k, v in t.items()}  # seconds per full chunk
            out[phase][lin.name] = t
    big = 2048
    out["reference"] = {"2048^3": gemm_seconds(big, big, big, dtype, reps)}
    return out


def measure_bandwidth(mib: int, reps: int) -> dict[str, float]:
    """Bytes per second of a large copy (read + write) and a large read (sum)."""
    n = mib * 2**20 // 4
    src, dst = torch.rand(n), torch.empty(n)
    t_copy = _best_time(lambda: dst.copy_(src), reps)
    t_read = _best_time(lambda: src.sum(), reps)
    return {"copy_Bps": 2 * n * 4 / t_copy, "read_Bps": n * 4 / t_read}


def _linear_cost(t: dict, shape: ModelShape, m: int, lm_rows: int) -> tuple[float, ...]:
    """(body FLOPs, body seconds, LM-head FLOPs, LM-head seconds) of one pass with m body
    rows and lm_rows LM-head rows, at the measured best time of each linear."""
    body_f = body_s = lm_f = lm_s = 0.0
    for lin in shape.linears:
        secs = t[lin.name]["best_s"] * lin.count
        if lin.name == "lm_head":
            lm_f, lm_s = 2.0 * lm_rows * lin.k * lin.n, secs
        else:
            body_f += 2.0 * m * lin.k * lin.n * lin.count
            body_s += secs
    return body_f, body_s, lm_f, lm_s


def floors(shape: ModelShape, wl: Workload, gemm: dict, bw_Bps: float, esize: int) -> Floors:
    """The workload's compute, memory and roofline floors (see the module docstring)."""
    kv_tok = shape.kv_elems_per_token() * esize
    weights = (shape.params - shape.embed_params) * esize
    attn_per_pair = 4.0 * shape.heads * shape.head_dim * shape.layers
    prompt_tokens = wl.num_prompts * wl.input_len
    n_pre = math.ceil(prompt_tokens / wl.budget)
    acc = {"prefill": [0.0, 0.0, 0.0, 0.0], "decode": [0.0, 0.0, 0.0, 0.0]}  # c, m, roof, flops
    bytes_total = 0.0
    # Prefill: chunks of `budget` prompt tokens; each prompt's causal pairs L(L+1)/2; the
    # LM head samples each prompt's last row once, spread evenly over the chunks.
    m_full = min(wl.budget, prompt_tokens)
    body_f, body_s, lm_f, lm_s = _linear_cost(gemm["prefill"], shape, m_full, wl.num_prompts)
    attn_f = attn_per_pair * wl.num_prompts * wl.input_len * (wl.input_len + 1) / 2
    for i in range(n_pre):
        share = min(wl.budget, prompt_tokens - i * wl.budget) / m_full
        c = body_s * share + lm_s / n_pre + attn_f / n_pre * body_s / body_f
        by = weights + share * m_full * (kv_tok + shape.hidden * esize)
        by += wl.num_prompts / n_pre * shape.vocab * 4  # float32 logits of sampled rows
        _add(acc["prefill"], c, by / bw_Bps, body_f * share + (lm_f + attn_f) / n_pre)
        bytes_total += by
    # Decode: output_len - 1 passes of num_prompts rows; the context grows by one per pass.
    body_f, body_s, lm_f, lm_s = _linear_cost(gemm["decode"], shape, wl.num_prompts, wl.num_prompts)
    sec_per_flop = (body_s + lm_s) / (body_f + lm_f)
    for step in range(1, wl.output_len):
        ctx = wl.input_len + step  # keys each query attends to, itself included
        a_f = attn_per_pair * wl.num_prompts * ctx
        c = body_s + lm_s + a_f * sec_per_flop
        by = weights + wl.num_prompts * (kv_tok * (ctx + 1) + shape.hidden * esize)
        by += wl.num_prompts * shape.vocab * 4
        _add(acc["decode"], c, by / bw_Bps, body_f + lm_f + a_f)
        bytes_total += by
    comp = sum(v[0] for v in acc.values())
    mem = sum(v[1] for v in acc.values())
    per_phase = {
        k: {"compute_s": v[0], "memory_s": v[1], "roofline_s": v[2], "flops": v[3]}
        for k, v in acc.items()
    }
    return Floors(
        compute_s=comp,
        memory_s=mem,
        roofline_s=sum(v[2] for v in acc.values()),
        binding=", ".join(f"{k} {'compute' if v[0] >= v[1] else 'memory'}" for k, v in acc.items()),
        flops=sum(v[3] for v in acc.values()),
        bytes=bytes_total,
        passes=n_pre + wl.output_len - 1,
        per_phase=per_phase,
    )


def _add(acc: list[float], c: float, m: float, flops: float) -> None:
    acc[0] += c
    acc[1] += m
    acc[2] += max(c, m)
    acc[3] += flops


def machine() -> dict:
    """CPU name, the ISA flags that decide the kernels, cores, load."""
    name, flags = platform.processor(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                if key.strip() == "model name" and not name:
                    name = val.strip()
                elif key.strip() in ("flags", "Features") and not flags:
                    flags = set(val.split())
    except OSError:
        pass
    wanted = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "bf16")
    return {
        "cpu": name or platform.machine(),
        "isa": [f for f in wanted if f in flags],
        "cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "loadavg": os.getloadavg(),
        "torch": torch.__version__,
    }
