"""CPU multi-LoRA op timings: a base linear layer alone against the same layer
plus `PunicaWrapperCPU.add_lora_linear` with the batch spread over 4 adapters
(and a gather-per-token einsum baseline, the naive way to batch adapters).

    .venv/bin/python benchmarks/benchmark_lora_ops.py [--threads N] [--repeat R]

Prints, per shape (tokens x hidden -> out, rank, prefill/decode layout), the
median milliseconds of: base matmul; base + LoRA (grouped ops); base + LoRA
(per-token gathered weights); and the ratio grouped / base.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from vllm.lora.layers import LoRAMapping
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

NUM_ADAPTERS = 4


def _median_ms(fn: Callable[[], None], repeat: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _mapping(tokens: int, prefill: bool) -> LoRAMapping:
    if prefill:  # 4 requests of equal length, one adapter each
        ids = [1 + i * NUM_ADAPTERS // tokens for i in range(tokens)]
    else:  # decode: one token per request, adapters interleaved
        ids = [1 + i % NUM_ADAPTERS for i in range(tokens)]
    return LoRAMapping(tuple(ids), tuple(ids), is_prefill=prefill)


def bench(
    tokens: int, hidden: int, out: int, rank: int, prefill: bool, dtype: torch.dtype, repeat: int
) -> str:
    x = torch.randn(tokens, hidden, dtype=dtype)
    w = torch.randn(out, hidden, dtype=dtype) / hidden**0.5
    a = torch.randn(NUM_ADAPTERS, 1, rank, hidden, dtype=dtype) / hidden**0.5
    b = torch.randn(NUM_ADAPTERS, 1, out, rank, dtype=dtype) / rank**0.5
    punica = PunicaWrapperCPU(max(tokens, 8), max(tokens, 8), "cpu")
    punica.update_metadata(
        _mapping(tokens, prefill), list(range(1, NUM_ADAPTERS + 1)), NUM_ADAPTERS, 32000
    )
    slots = punica.token_lora_indices.clone()

    def base() -> None:
        torch.mm(x, w.t())

    def grouped() -> None:
        y = torch.mm(x, w.t())
        punica.add_lora_linear(y, x, (a,), (b,), 1.0, (out,))

    def per_token() -> None:
        y = torch.mm(x, w.t())
        sa, sb = a[slots, 0].float(), b[slots, 0].float()  # [T, r, h], [T, out, r]
        s = torch.einsum("th,trh->tr", x.float(), sa)
        y += torch.einsum("tr,tor->to", s, sb).to(dtype)

    t_base, t_grp, t_tok = (_median_ms(f, repeat) for f in (base, grouped, per_token))
    layout = "prefill" if prefill else "decode"
    return (
        f"{tokens:5d} x {hidden:5d} -> {out:5d} r={rank:2d} {layout:7s} {str(dtype)[6:]:8s} "
        f"base {t_base:8.3f} ms  +lora grouped {t_grp:8.3f} ms ({t_grp / t_base:4.2f}x)  "
        f"+lora per-token {t_tok:8.3f} ms ({t_tok / t_base:5.2f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch default)")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch threads: {torch.get_num_threads()}, {NUM_ADAPTERS} adapters")
    for dtype in (torch.float32, torch.bfloat16):
        for tokens, prefill in ((512, True), (64, False)):
            for hidden, out, rank in ((1024, 1024, 16), (2048, 5632, 16), (2048, 2048, 8)):
                print(bench(tokens, hidden, out, rank, prefill, dtype, args.repeat), flush=True)


if __name__ == "__main__":
    main()
