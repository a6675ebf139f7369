"""Weight-only quantized GEMM timings on CPU (not a test).

Compares, per (M, K, N), on bf16 activations:
  - int8_group_gemm (group 32; group 32 + offsets) and fp8_weight_gemm
    (group 128, or 64 where K = 576; per-channel), compiled ops (csrc/cpu/quant_gemm.cpp);
  - the same wrappers' pure-PyTorch path (VLLM's fallback: dequantize 256
    rows at a time, fp32 mm);
  - dense bf16 F.linear (the unquantized model's GEMM);
  - aten._weight_int8pack_mm (torch's int8 per-channel weight-only GEMM).
Shapes: a ~135M model's (576 -> 1536, 1536 -> 576, 576 -> 49152 LM head)
and a 1B one's (2048 -> 8192). Medians of --repeats timed calls after
warm-up (fewer for calls over ~0.1 s), --threads torch threads.

    python benchmarks/benchmark_quant_gemm.py [--threads 2] [--repeats 30]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from vllm import _custom_ops as ops

SHAPES = [(576, 1536), (1536, 576), (576, 49152), (2048, 8192)]  # (K, N)
M_VALUES = [1, 16, 256]


def _median_us(fn: Callable[[], object], repeats: int) -> float:
    """Median of `repeats` calls (fewer, at least 3, for a call of over
    ~0.1 s: the torch paths' fp8 conversion is that slow) after warm-up."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    fn()
    repeats = max(3, min(repeats, int(2.0 / max(first, 1e-9))))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _torch_path(fn: Callable[[], object]) -> Callable[[], object]:
    """Run a wrapper with the compiled ops hidden (its fallback)."""

    def run() -> object:
        saved, ops._LOAD_ERROR = ops._LOAD_ERROR, "benchmark: torch path"
        try:
            return fn()
        finally:
            ops._LOAD_ERROR = saved

    return run


def _cases(m: int, k: int, n: int) -> dict[str, Callable[[], object]]:
    x = torch.randn(m, k).to(torch.bfloat16)
    w8 = torch.randint(-128, 128, (n, k), dtype=torch.int8)
    s32 = torch.rand(n, k // 32) * 0.01
    o32 = torch.randn(n, k // 32) * 0.01
    wf8 = (torch.randn(n, k) * 50).to(torch.float8_e4m3fn)
    gf = 128 if k % 128 == 0 else 64  # block FP8's 128 where K allows (576 = 9 x 64)
    s128 = torch.rand(n, k // gf) * 0.01
    s_ch = torch.rand(n, 1) * 0.01
    dense = torch.randn(n, k).to(torch.bfloat16)
    s_bf16 = (torch.rand(n) * 0.01).to(torch.bfloat16)
    int8 = lambda: ops.int8_group_gemm(x, w8, s32, 32)  # noqa: E731
    fp8 = lambda: ops.fp8_weight_gemm(x, wf8, s128, gf)  # noqa: E731
    return {
        "int8 g32": int8,
        "int8 g32+off": lambda: ops.int8_group_gemm(x, w8, s32, 32, o32),
        "fp8 g128/64": fp8,
        "fp8 per-ch": lambda: ops.fp8_weight_gemm(x, wf8, s_ch, k),
        "int8 g32 torch": _torch_path(int8),
        "fp8 g128/64 torch": _torch_path(fp8),
        "bf16 F.linear": lambda: F.linear(x, dense),
        "int8pack_mm": lambda: torch.ops.aten._weight_int8pack_mm(x, w8, s_bf16),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--m", type=int, nargs="*", default=M_VALUES)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    isa = torch.ops._C_cpu.quant_gemm_isa() if ops._has_cpu_op("quant_gemm_isa") else "none"
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"load average {load}, {args.threads} threads, compiled path: {isa}, "
          f"medians of {args.repeats} (us)")  # fmt: skip
    header = None
    for k, n in SHAPES:
        for m in args.m:
            cases = _cases(m, k, n)
            if header is None:
                header = ["M", "K", "N", *cases]
                print("| " + " | ".join(header) + " |")
                print("|" + "---|" * len(header))
            row = [f"{_median_us(fn, args.repeats):.0f}" for fn in cases.values()]
            print(f"| {m} | {k} | {n} | " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
