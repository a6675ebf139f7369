"""Decode-shaped GEMMs on CPU: the bf16 weight (oneDNN-packed, as unquantized
linears run) against the compressed-tensors W8A16 / W4A16 methods' kernels
(int8 per channel, int4 per group of 128), built through the real quant
methods. A benchmark, not a test: one run, on this machine.

python benchmarks/kernels/benchmark_weight_only_gemm.py [--tokens 1 8] [--iters 200]
"""

from __future__ import annotations

import argparse
import time

import torch

from vllm.model_executor.layers.linear import RowParallelLinear
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
    CompressedTensorsConfig,
)

# (K, N) of a Llama-1B-like layer: qkv, o, gate_up, down.
SHAPES = [(2048, 3072), (2048, 2048), (2048, 16384), (8192, 2048)]


def _config(bits: int) -> CompressedTensorsConfig:
    weights = {"num_bits": bits, "type": "int", "symmetric": True}
    weights.update(
        strategy="channel" if bits == 8 else "group", group_size=None if bits == 8 else 128
    )
    group = {"targets": ["Linear"], "weights": weights, "format": "pack-quantized"}
    return CompressedTensorsConfig.from_config({"config_groups": {"g": group}})


def _layer(k: int, n: int, bits: int | None) -> RowParallelLinear:
    quant = None if bits is None else _config(bits)
    layer = RowParallelLinear(k, n, bias=False, params_dtype=torch.bfloat16, quant_config=quant)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if p.dtype == torch.int32:  # packed int values: any bit pattern is valid
                p.copy_(torch.randint(-(2**31), 2**31 - 1, p.shape, dtype=torch.int32))
            elif name != "weight_shape":
                p.copy_(torch.randn(p.shape) * (0.01 if "scale" in name else 1.0))
    layer.process_weights_after_loading(torch.bfloat16)
    return layer


def _time(layer: RowParallelLinear, x: torch.Tensor, iters: int) -> float:
    for _ in range(10):
        layer(x)
    start = time.perf_counter()
    for _ in range(iters):
        layer(x)
    return (time.perf_counter() - start) / iters * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'M':>3} {'K':>6} {'N':>6} {'bf16 us':>9} {'w8a16 us':>9} {'w4a16 us':>9}")
    with torch.no_grad():
        for m in args.tokens:
            for k, n in SHAPES:
                x = torch.randn(m, k, dtype=torch.bfloat16)
                us = [_time(_layer(k, n, bits), x, args.iters) for bits in (None, 8, 4)]
                print(f"{m:>3} {k:>6} {n:>6} " + " ".join(f"{t:>9.1f}" for t in us))


if __name__ == "__main__":
    main()
