"""Where one engine step's CPU time goes (issue 21 item 4), in one process.

    VLLM_ENABLE_V1_MULTIPROCESSING=0 is set here: the engine core and the worker run in
    this process, so every part of a step is timed on one clock.

    .venv/bin/python benchmarks/profile_cpu_step.py [--model DIR] [--dtype float32]
        [--num-prompts 64 --input-len 128 --output-len 128] [--ops]

The workload is the peer one (`../shared/peer/`: prompts of random ids, greedy, ignore_eos).
A short warm-up pass runs first; then the timed pass, with each part of the step wrapped
by a perf_counter timer (class-level wrappers installed by this script only: the engine's
code is unchanged). Steps are split into prefill steps (any request with more than one
scheduled token) and decode steps. Printed per phase: ms per step and share of the step
for the engine's parts (schedule, input prep, forward, LM head, sampler, output
processing) and the forward's parts (GEMMs per projection, attention incl. the cache write,
norms, rotary, activation, embedding). Times are inclusive (a part's time holds the parts
inside it); "other" rows are the remainders. A wrapper costs ~1 us per call.

`--ops` also records one decode step with torch.profiler and prints the top ops by
self CPU time.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

HERE = os.path.dirname(os.path.abspath(__file__))
PEER_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "peer"))
DEFAULT_MODEL = os.path.expanduser("~/.cache/vllm-peer/models/qwen2-rand-120m-fp32")

# Accumulated seconds and calls per (phase, part); the phase is set per engine step.
_TOTALS: dict[tuple[str, str], float] = defaultdict(float)
_CALLS: dict[tuple[str, str], int] = defaultdict(int)
_STATE: dict[str, Any] = {"phase": "decode", "enabled": False, "clock": time.perf_counter}


def _timed(part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not _STATE["enabled"]:
            return fn(*args, **kwargs)
        clock = _STATE["clock"]
        t0 = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            key = (str(_STATE["phase"]), part)
            _TOTALS[key] += clock() - t0
            _CALLS[key] += 1

    return wrapper


def _wrap(cls: type, method: str, part: str) -> None:
    setattr(cls, method, _timed(part, getattr(cls, method)))


def _schedule_with_phase(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Scheduler.schedule: sets the phase of the step it schedules."""

    @functools.wraps(fn)
    def wrapper(self: Any) -> Any:
        out = fn(self)
        counts = out.num_scheduled_tokens.values()
        _STATE["phase"] = "prefill" if any(n > 1 for n in counts) else "decode"
        return out

    return wrapper


def install_timers() -> None:
    """Wrap the parts of a step (classes of the in-process engine and the model)."""
    from vllm.model_executor.layers import linear
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.attention import Attention
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.engine_core import EngineCore
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    from vllm.v1.worker.gpu.sample.sampler import Sampler

    Scheduler.schedule = _schedule_with_phase(Scheduler.schedule)  # type: ignore[method-assign]
    for cls, method, part in [
        (EngineCore, "step", "step"),
        (Scheduler, "schedule", "schedule"),
        (Scheduler, "update_from_output", "update_from_output"),
        (OutputProcessor, "process_outputs", "output_processing"),
        (GPUModelRunner, "execute_model", "execute_model"),
        (GPUModelRunner, "prepare_inputs", "prepare_inputs"),
        (GPUModelRunner, "prepare_attn", "prepare_attn"),
        (GPUModelRunner, "_run_model", "run_model"),
        (GPUModelRunner, "sample_tokens", "sample_tokens"),
        (GPUModelRunner, "postprocess", "postprocess"),
        (Sampler, "__call__", "sampler"),
        (LogitsProcessor, "forward", "lm_head"),
        (VocabParallelEmbedding, "forward", "embedding"),
        (Attention, "forward", "attention"),
        (RMSNorm, "forward", "norm"),
        (RotaryEmbedding, "forward", "rotary"),
        (SiluAndMul, "forward", "silu_and_mul"),
        (linear.QKVParallelLinear, "forward", "gemm.qkv"),
        (linear.MergedColumnParallelLinear, "forward", "gemm.gate_up"),
        (linear.RowParallelLinear, "forward", "gemm.o_and_down"),
    ]:
        _wrap(cls, method, part)


_ROWS = [
    # (part, parent for the indented view)
    ("step", None),
    ("schedule", "step"),
    ("execute_model", "step"),
    ("prepare_inputs", "execute_model"),
    ("prepare_attn", "execute_model"),
    ("run_model", "execute_model"),
    ("embedding", "run_model"),
    ("gemm.qkv", "run_model"),
    ("gemm.o_and_down", "run_model"),
    ("gemm.gate_up", "run_model"),
    ("attention", "run_model"),
    ("norm", "run_model"),
    ("rotary", "run_model"),
    ("silu_and_mul", "run_model"),
    ("lm_head", "run_model"),
    ("sample_tokens", "step"),
    ("sampler", "sample_tokens"),
    ("postprocess", "sample_tokens"),
    ("update_from_output", "step"),
    ("output_processing", None),
]


def report(wall_s: float) -> dict[str, Any]:
    """Prints the per-phase table and returns it as a dict."""
    out: dict[str, Any] = {}
    for phase in ("prefill", "decode"):
        steps = _CALLS.get((phase, "step"), 0)
        if not steps:
            continue
        step_ms = _TOTALS[(phase, "step")] * 1e3 / steps
        rows = {}
        print(f"\n{phase}: {steps} steps, {step_ms:.2f} ms per engine step")
        children: dict[str, float] = defaultdict(float)
        for part, parent in _ROWS:
            ms = _TOTALS.get((phase, part), 0.0) * 1e3 / steps
            rows[part] = round(ms, 3)
            if parent:
                children[parent] += ms
            depth = 0
            p = parent
            while p:
                depth += 1
                p = dict(_ROWS)[p]
            print(f"  {'  ' * depth}{part:<22s}{ms:9.2f} ms  {100 * ms / step_ms:5.1f}%")
        for parent in ("step", "run_model", "execute_model", "sample_tokens"):
            ms = _TOTALS.get((phase, parent), 0.0) * 1e3 / steps - children[parent]
            rows[f"{parent}.other"] = round(ms, 3)
            print(f"  other in {parent:<13s}{ms:9.2f} ms  {100 * ms / step_ms:5.1f}%")
        out[phase] = {"steps": steps, "step_ms": round(step_ms, 3), "parts_ms": rows}
    out["wall_s"] = round(wall_s, 3)
    return out


def profile_ops(llm: Any, prompts: list[Any], sp: Any) -> None:
    """torch.profiler over the decode steps of a short run: top ops by self CPU time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    engine = llm.llm_engine
    for i, p in enumerate(prompts):
        engine.add_request(f"ops-{i}", p, sp)
    engine.step()  # the prefill (one chunk for the peer workload)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(4):
            engine.step()
    while engine.has_unfinished_requests():
        engine.step()
    print("\ntorch.profiler, 4 decode steps, top ops by self CPU time:")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    del torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: this process's CPU time (all threads; with OMP_NUM_THREADS=1 the work "
        "itself, steadier than wall time on a loaded machine)",
    )
    ap.add_argument("--ops", action="store_true", help="also torch.profiler over decode steps")
    ap.add_argument("--json", default="", help="write the breakdown here")
    a = ap.parse_args()

    sys.path.insert(0, PEER_DIR)
    from workload import make_prompts  # the peer workload's prompt ids

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    if a.clock == "cpu":
        _STATE["clock"] = time.process_time
    install_timers()
    llm = LLM(model=a.model, dtype=a.dtype, max_model_len=a.max_model_len, seed=0)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in make_prompts(a.num_prompts, a.input_len)]
    warm = SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.0)
    llm.generate(prompts, warm, use_tqdm=False)
    sp = SamplingParams(max_tokens=a.output_len, ignore_eos=True, temperature=0.0)
    _STATE["enabled"] = True
    t0, c0 = time.perf_counter(), time.process_time()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    _STATE["enabled"] = False
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    print(
        f"timed pass: {wall:.2f} s wall, {cpu:.2f} CPU-s, {n_out / wall:.1f} out tok/s "
        f"(timers on, clock {a.clock})"
    )
    result = report(wall)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    if a.ops:
        profile_ops(llm, prompts, sp)


if __name__ == "__main__":
    main()
