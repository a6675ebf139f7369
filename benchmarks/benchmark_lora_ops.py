"""CPU multi-LoRA op timings: a base linear layer alone against the same layer
plus LoRA with the batch spread over 4 adapters, three ways.

    .venv/bin/python benchmarks/benchmark_lora_ops.py [--threads N] [--repeat R]

- plan: `PunicaWrapperCPU.add_lora_linear`, the step's token plan computed
  once in update_metadata (vllm/lora/ops/torch_ops/lora_plan.py);
- per-op: the sgmv ops per slice, which re-derive the grouping in every call
  and compute in float32 (the wrapper before the plan);
- per-token: gathered per-token weights and an einsum (upstream's torch ops).

Shapes are the peer benchmark model's layers (hidden 768, 2 KV heads, MLP
2048: qkv 3 slices, o, gate_up 2 slices, down), rank 16, for three layouts:
decode (32 tokens, adapters interleaved), prefill of 32 x 128 tokens with the
requests' adapters interleaved, and the same prefill with the requests sorted
by adapter. Prints median ms and the ratio to the base matmul. Times are
this thread's CPU time (time.thread_time), so that on a shared, oversubscribed
machine the time spent descheduled is not counted: run with 1 torch thread.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from vllm.lora.layers import LoRAMapping
from vllm.lora.ops.torch_ops import sgmv_expand_slice, sgmv_shrink
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

NUM_ADAPTERS, RANK = 4, 16
# (name, in features, output slices)
LAYERS = (
    ("qkv", 768, (768, 128, 128)),
    ("o", 768, (768,)),
    ("gate_up", 768, (2048, 2048)),
    ("down", 2048, (768,)),
)
LAYOUTS = {  # name -> (requests, tokens per request, sorted by adapter)
    "decode": (32, 1, False),
    "prefill": (32, 128, False),
    "prefill-sorted": (32, 128, True),
}


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.thread_time()
        fn()
        times.append((time.thread_time() - t0) * 1e3)
    return statistics.median(times)


def _mapping(layout: str) -> LoRAMapping:
    reqs, per_req, by_adapter = LAYOUTS[layout]
    order = sorted(range(reqs), key=lambda r: r % NUM_ADAPTERS) if by_adapter else range(reqs)
    ids = [1 + r % NUM_ADAPTERS for r in order for _ in range(per_req)]
    return LoRAMapping(tuple(ids), tuple(ids), is_prefill=True)


def _per_op(punica: PunicaWrapperCPU, y, x, a, b, slices) -> None:  # type: ignore[no-untyped-def]
    meta = punica.prefill_metadata
    off = 0
    for a_s, b_s, n in zip(a, b, slices):
        buf = torch.zeros(x.size(0), RANK, dtype=torch.float32)
        sgmv_shrink(x, a_s, buf, *meta, 1.0)
        sgmv_expand_slice(buf, b_s, y, *meta, off, n, True)
        off += n


def _per_token(slots: torch.Tensor, y, x, a, b, slices) -> None:  # type: ignore[no-untyped-def]
    off = 0
    for a_s, b_s, n in zip(a, b, slices):
        sa, sb = a_s[slots, 0].float(), b_s[slots, 0].float()  # [T, r, in], [T, out, r]
        s = torch.einsum("ti,tri->tr", x.float(), sa)
        y[:, off : off + n] += torch.einsum("tr,tor->to", s, sb).to(y.dtype)
        off += n


def bench(layer: tuple, layout: str, dtype: torch.dtype, repeat: int, slow: bool) -> str:
    name, hidden, slices = layer
    mapping = _mapping(layout)
    tokens = len(mapping.index_mapping)
    x = torch.randn(tokens, hidden, dtype=dtype)
    w = torch.randn(sum(slices), hidden, dtype=dtype) / hidden**0.5
    a = tuple(torch.randn(NUM_ADAPTERS, 1, RANK, hidden, dtype=dtype) / hidden**0.5 for _ in slices)
    b = tuple(torch.randn(NUM_ADAPTERS, 1, n, RANK, dtype=dtype) / RANK**0.5 for n in slices)
    punica = PunicaWrapperCPU(tokens, tokens, "cpu")
    punica.update_metadata(mapping, list(range(1, NUM_ADAPTERS + 1)), NUM_ADAPTERS, 32000)
    slots = punica.token_lora_indices.clone()
    t_base = _median_ms(lambda: torch.mm(x, w.t()), repeat)
    runs = {
        "plan": lambda: punica.add_lora_linear(torch.mm(x, w.t()), x, a, b, 1.0, slices),
        "per-op": lambda: _per_op(punica, torch.mm(x, w.t()), x, a, b, slices),
    }
    if slow:
        runs["per-token"] = lambda: _per_token(slots, torch.mm(x, w.t()), x, a, b, slices)
    kind = "dense" if punica.plan.dense else f"{len(punica.plan.items)} items"
    cols = "  ".join(
        f"{k} {t:8.3f} ms ({t / t_base:5.2f}x)"
        for k, t in ((k, _median_ms(f, repeat)) for k, f in runs.items())
    )
    return (
        f"{layout:14s} {tokens:5d} tok {name:7s} {str(dtype)[6:]:8s} [{kind:9s}] "
        f"base {t_base:8.3f} ms  {cols}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch default)")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--per-token", action="store_true", help="also time upstream's way")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch threads: {torch.get_num_threads()}, {NUM_ADAPTERS} adapters, rank {RANK}")
    for dtype in (torch.float32, torch.bfloat16):
        for layout in LAYOUTS:
            for layer in LAYERS:
                print(bench(layer, layout, dtype, args.repeat, args.per_token), flush=True)


if __name__ == "__main__":
    main()
