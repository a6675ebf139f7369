"""In-process A/B of BERT's fused CPU post-ops (bert.py `_cpu_packed_weight`:
dense + GELU and dense + bias + residual as single oneDNN calls) against the
unfused path, on one engine, so both variants see the same spells of load.

    .venv/bin/python benchmarks/benchmark_bert_fusion_ab.py \\
        [--model DIR] [--dtype bfloat16] [--num-prompts 64] [--iters 3]

One LLM(model, runner="pooling") in this process (VLLM_ENABLE_V1_MULTIPROCESSING
=0); each iteration times one full `embed` pass per variant, alternating which
goes first. "unfused" makes `_cpu_packed_weight` answer None (the layers then
take their plain dense -> activation / + residual path). Printed per variant:
median wall seconds and prompt tok/s, median CPU seconds of this process (user +
system) and tok per CPU-second, median minor page faults per pass, and the
minimum cosine of its vectors against the fused variant's. Prompts as in
benchmark_pooling_peer.py (random.Random(0), 32-256 tokens).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_VARIANTS = ("fused", "unfused")


def _timed(llm: Any, prompts: list[Any]) -> tuple[float, float, int, list[Any]]:
    """(wall s, CPU s, minor faults, outputs) of one embed pass."""
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    outs = llm.embed(prompts, use_tqdm=False)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
    return wall, cpu, r1.ru_minflt - r0.ru_minflt, outs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default=os.path.expanduser("~/.cache/vllm-peer/models/bert-base-st")
    )
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--iters", type=int, default=3)
    args = parser.parse_args()

    import torch
    from benchmark_pooling_peer import make_prompts

    import vllm.model_executor.models.bert as bert
    from vllm import LLM
    from vllm.inputs import TokensPrompt

    fused_fn = bert._cpu_packed_weight
    active = {"name": "fused"}

    def switch(linear: torch.nn.Module) -> torch.Tensor | None:
        return fused_fn(linear) if active["name"] == "fused" else None

    bert._cpu_packed_weight = switch  # read at call time by the layers' forward
    prompts = [TokensPrompt(prompt_token_ids=p) for p in make_prompts(args.num_prompts, 32, 256)]
    tokens = sum(len(p["prompt_token_ids"]) for p in prompts)
    llm = LLM(model=args.model, runner="pooling", dtype=args.dtype, max_model_len=512, seed=0)
    llm.embed(prompts[:8], use_tqdm=False)  # warm-up
    runs: dict[str, list[tuple[float, float, int]]] = {v: [] for v in _VARIANTS}
    vectors: dict[str, torch.Tensor] = {}
    for it in range(args.iters):
        for name in _VARIANTS if it % 2 == 0 else _VARIANTS[::-1]:
            active["name"] = name
            wall, cpu, faults, outs = _timed(llm, prompts)
            runs[name].append((wall, cpu, faults))
            vectors[name] = torch.tensor([o.outputs.embedding for o in outs])
    print(
        f"{args.model}: {len(prompts)} prompts, {tokens} tokens, {args.dtype}, {args.iters} iters"
    )
    for name in _VARIANTS:
        wall = statistics.median(r[0] for r in runs[name])
        cpu = statistics.median(r[1] for r in runs[name])
        faults = statistics.median(r[2] for r in runs[name])
        cos = torch.nn.functional.cosine_similarity(vectors["fused"], vectors[name]).min()
        print(
            f"{name:8s} wall {wall:6.2f} s {tokens / wall:6.0f} tok/s  cpu {cpu:6.2f} s "
            f"{tokens / cpu:6.0f} tok/CPU-s  minor faults {faults:8.0f}  cosine vs fused {cos:.6f}"
        )


if __name__ == "__main__":
    main()
