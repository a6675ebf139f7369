"""The peer workload against this machine's own limit (issue 21 item 3).

    .venv/bin/python benchmarks/benchmark_roofline.py [--dtype auto|float32|bfloat16]
        [--iters 2] [--engines ours,upstream-1proc] [--out benchmarks/results/roofline_X.json]

1. Measures what torch achieves here:
   - GEMM throughput at every linear shape of the model, with the rows of a decode step (all
     prompts, one token each) and of a prefill chunk (`--max-num-batched-tokens`, timed on
     256-row slices), plus a 2048^3 reference: `F.linear` on the [N, K] weight and oneDNN's
     packed path (the engine's CPU GEMM), each at the engines' thread count and at one
     thread; best call of at least `--reps` and 0.3 s. The floor takes the fastest, a
     one-thread time divided by the thread count included (perfect scaling: on a loaded
     machine the one-thread best is the steadier figure, and a floor must not exceed what
     the cores can do). The weights stay in cache between calls: the compute side only.
   - memory bandwidth: a large copy (read + write bytes / s) and a large read (`sum`) of
     `--bw-mib` MiB, far beyond the last-level cache; the floor uses the higher of the two.
2. Computes the workload's floors per forward pass (the workload of `../shared/peer/`:
   prompts x input ids -> output greedy tokens, from its workload_64x128.json):
   - compute: linear FLOPs (2 x rows x K x N per linear; the LM head only on the rows that
     sample) timed at the measured rate of each shape, plus attention's FLOPs (4 x heads x
     head_dim per query-key pair: QK^T and PV; causal in prefill) at the pass's mean rate;
   - memory: every weight read once per pass (embedding: only the rows looked up), KV
     written once per token and read by each decode query over its context, float32 logits
     written per sampled row.
   A pass costs at least max(compute, memory) (the roofline); prefill runs in
   ceil(prompt tokens / budget) passes, then output_len - 1 decode passes of `num_prompts`
   rows. The floor is the sum; each phase's binding side is the larger of its two sums.
3. Runs each engine on the workload in its own process (its interpreter runs this file with
   `--drive`: the LLM calls of `../shared/peer/bench_offline.py`, the script `compare.sh`
   runs, with its env and model) and prints the last pass as a fraction of the floor, by wall
   time (floor / wall: 1.0 = at the machine's limit) and by CPU time (floor x cores / CPU
   seconds of the engine's processes). Upstream runs where `~/.cache/vllm-peer/upstream-venv`
   exists: `upstream-1proc` is its faster setting here (`VLLM_ENABLE_V1_MULTIPROCESSING=0
   OMP_NUM_THREADS=<cores>`), `upstream` its default.

On a shared machine the GEMM and bandwidth figures move with the load: the report prints the
load average and each engine run's foreign CPU share next to its figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from roofline_floors import (  # noqa: E402
    Floors,
    ModelShape,
    Workload,
    checkpoint_params,
    floors,
    machine,
    measure_bandwidth,
    measure_gemms,
    model_shape,
)

PEER_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "peer"))
PEER_HOME = os.path.expanduser(os.environ.get("PEER_HOME", "~/.cache/vllm-peer"))
UPSTREAM_PY = os.path.join(PEER_HOME, "upstream-venv", "bin", "python")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class EngineRun:
    tag: str
    ok: bool
    steady_wall_s: float = 0.0  # the last pass (warm when --iters >= 2)
    steady_cpu_s: float = 0.0  # CPU seconds of the engine's process tree in that pass
    out_tok_per_s: float = 0.0
    init_s: float = 0.0
    foreign_cpu_frac: float = 0.0  # other processes' share of the machine in that pass
    error: str = ""
    runs: list[dict] = field(default_factory=list)


def drive(args: argparse.Namespace) -> None:
    """--drive: run inside the engine's interpreter (ours or upstream's): the LLM calls of
    ../shared/peer/bench_offline.py on its workload, each pass timed in wall and in CPU
    seconds of this process tree (the engine core may be a child). Prints ROOFLINE_JSON."""
    sys.path.insert(0, args.peer_dir)
    from workload import TreeRSS, foreign_load, make_prompts, wait_quiet

    tree = TreeRSS()
    tree.__enter__()
    t0 = time.perf_counter()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=1024, seed=0)
    init_s = time.perf_counter() - t0
    with open(os.path.join(args.peer_dir, "workload_64x128.json")) as f:
        spec = json.load(f)
    prompts = [
        TokensPrompt(prompt_token_ids=p)
        for p in make_prompts(spec["num_prompts"], spec["input_len"])
    ]
    sp = SamplingParams(max_tokens=spec["output_len"], ignore_eos=True, temperature=0.0)
    runs = []
    for _ in range(args.iters):
        wait_quiet(tree, max_wait_s=args.max_wait_quiet)
        c0, w0 = tree.cpu_snapshot(), time.perf_counter()
        outs = llm.generate(prompts, sp, use_tqdm=False)
        wall, c1 = time.perf_counter() - w0, tree.cpu_snapshot()
        n_out = sum(len(o.outputs[0].token_ids) for o in outs)
        runs.append(
            dict(
                wall_s=wall,
                cpu_s=c1[1] - c0[1],
                out_tokens=n_out,
                foreign=foreign_load(c0, c1, wall),
            )
        )
    tree.__exit__()
    first = list(outs[0].outputs[0].token_ids[:8])
    print(
        "ROOFLINE_JSON " + json.dumps(dict(init_s=init_s, runs=runs, first_ids=first)), flush=True
    )


def run_engine(tag: str, python: str, model: str, dtype: str, args) -> EngineRun:
    """One engine process on the workload (compare.sh's env), its last pass."""
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    if args.threads:
        # Both engines on --threads threads; upstream binds its own threads unless told not to.
        env.update(OMP_NUM_THREADS=str(args.threads), VLLM_CPU_OMP_THREADS_BIND="nobind")
    if tag == "upstream-1proc":
        env.setdefault("OMP_NUM_THREADS", str(machine()["cores"]))
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    cmd = [python, os.path.abspath(__file__), "--drive", "--model", model, "--dtype", dtype]
    cmd += ["--iters", str(args.iters), "--max-wait-quiet", str(args.max_wait_quiet)]
    cmd += ["--peer-dir", args.peer_dir]
    try:
        proc = subprocess.run(
            cmd, cwd="/tmp", env=env, capture_output=True, text=True, timeout=args.engine_timeout
        )
    except subprocess.TimeoutExpired:
        return EngineRun(tag, False, error=f"timed out after {args.engine_timeout} s")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ROOFLINE_JSON ")]
    if not lines:
        tail = (proc.stdout + proc.stderr)[-600:]
        return EngineRun(tag, False, error=f"rc {proc.returncode}: {tail}")
    res = json.loads(lines[-1].split(" ", 1)[1])
    last = res["runs"][-1]
    return EngineRun(
        tag,
        True,
        steady_wall_s=last["wall_s"],
        steady_cpu_s=last["cpu_s"],
        out_tok_per_s=last["out_tokens"] / last["wall_s"],
        init_s=res["init_s"],
        foreign_cpu_frac=last["foreign"],
        runs=res["runs"],
    )


def _resolve_dtype(asked: str) -> str:
    """compare.sh's rule (and ours for dtype="auto"): bf16 only with native bf16."""
    if asked != "auto":
        return asked
    sys.path.insert(0, os.path.dirname(HERE))
    from vllm.platforms.cpu_capability import cpu_has_native_bf16

    return "bfloat16" if cpu_has_native_bf16() else "float32"


def _print_rates(shape: ModelShape, wl: Workload, gemm: dict, bw: dict) -> None:
    """GFLOP/s per linear: the floor's figure, then (dense, packed) at the engines'
    threads and at one thread."""
    prefill_rows = min(wl.budget, wl.num_prompts * wl.input_len)
    for phase in ("decode", "prefill"):
        print(f"  GEMM GFLOP/s, {phase} rows (floor: dense/packed at T threads, at 1 thread):")
        for lin in shape.linears:
            m = wl.num_prompts if lin.name == "lm_head" or phase == "decode" else prefill_rows
            _print_gemm(f"{lin.name} M={m}", 2.0 * m * lin.k * lin.n, gemm[phase][lin.name])
    _print_gemm("reference 2048^3", 2.0 * 2048**3, gemm["reference"]["2048^3"])
    copy, read = bw["copy_Bps"] / 1e9, bw["read_Bps"] / 1e9
    print(f"  memory: copy {copy:.1f} GB/s (read + write), read {read:.1f} GB/s")


def _print_gemm(label: str, flops: float, t: dict[str, float]) -> None:
    rates = {k: flops / v / 1e9 for k, v in t.items()}
    rest = ", ".join(f"{k} {v:.0f}" for k, v in rates.items() if k != "best_s")
    print(f"    {label:24s} {rates['best_s']:6.0f}  ({rest})")


def _print_floor(fl: Floors, out_tokens: int) -> None:
    tflop, gb = fl.flops / 1e12, fl.bytes / 1e9
    print(f"  workload: {tflop:.2f} TFLOP, {gb:.1f} GB moved, {fl.passes} passes")
    print(
        f"  floors: compute {fl.compute_s:.2f} s, memory {fl.memory_s:.2f} s, "
        f"roofline (per pass max) {fl.roofline_s:.2f} s = {out_tokens / fl.roofline_s:.0f} "
        f"out tok/s; binding: {fl.binding}"
    )
    for phase, v in fl.per_phase.items():
        print(
            f"    {phase:7s}: compute {v['compute_s']:.2f} s, memory {v['memory_s']:.2f} s, "
            f"roofline {v['roofline_s']:.2f} s"
        )


def _print_runs(runs: list[EngineRun], fl: Floors, cores: int) -> None:
    """Each engine's last pass as a fraction of the roofline floor: by wall time, and by
    CPU time (the floor's core-seconds, floor x threads, over the CPU seconds the engine's
    processes used: on a shared machine the wall figure mostly says how much CPU it won;
    with several threads under load, OpenMP barrier waits inflate the CPU time too)."""
    for r in runs:
        if not r.ok:
            print(f"  {r.tag:15s} failed: {r.error}")
            continue
        print(
            f"  {r.tag:15s} {r.steady_wall_s:6.2f} s wall = {r.out_tok_per_s:6.1f} out tok/s: "
            f"{fl.roofline_s / r.steady_wall_s:5.1%} of the floor by wall, "
            f"{fl.roofline_s * cores / r.steady_cpu_s:5.1%} by CPU time "
            f"({r.steady_cpu_s:.1f} CPU-s); init {r.init_s:.1f} s, "
            f"foreign CPU {r.foreign_cpu_frac:.0%}"
        )
    ok = {r.tag: r for r in runs if r.ok}
    ups = [r for t, r in ok.items() if t.startswith("upstream")]
    if "ours" in ok and ups:
        best = max(ups, key=lambda r: r.out_tok_per_s)
        ours = ok["ours"]
        by_wall = ours.out_tok_per_s / best.out_tok_per_s
        by_cpu = best.steady_cpu_s / ours.steady_cpu_s
        print(f"  ours / upstream's faster ({best.tag}): {by_wall:.2f}x wall, {by_cpu:.2f}x CPU")


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="auto", choices=["auto", *_DTYPES])
    ap.add_argument("--model", default="", help="default: the peer Qwen2 of --dtype")
    ap.add_argument("--peer-dir", default=PEER_DIR)
    ap.add_argument(
        "--max-num-batched-tokens", type=int, default=4096, help="both CPU LLMs' default"
    )
    ap.add_argument("--reps", type=int, default=5, help="GEMM / bandwidth calls (best kept)")
    ap.add_argument("--bw-mib", type=int, default=512)
    ap.add_argument(
        "--engines",
        default="ours,upstream-1proc",
        help="comma list of ours, upstream-1proc, upstream; empty: floors only",
    )
    ap.add_argument(
        "--iters", type=int, default=2, help="workload passes per engine (1 = cold only)"
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="threads of the GEMMs, the floors and both engines (OMP_NUM_THREADS); 0: the "
        "engines' defaults (all cores). 1 on a loaded shared machine: a single thread is "
        "time-sliced but never stalls at an OpenMP barrier, so its CPU time stays honest",
    )
    ap.add_argument("--max-wait-quiet", type=float, default=20)
    ap.add_argument("--engine-timeout", type=float, default=1200)
    ap.add_argument("--out", default="", help="write the figures as JSON here")
    ap.add_argument("--drive", action="store_true", help=argparse.SUPPRESS)  # see drive()
    return ap.parse_args()


def main() -> None:
    args = _parse_args()
    if args.drive:
        return drive(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = _resolve_dtype(args.dtype)
    model = args.model or os.path.join(
        PEER_HOME, "models", "qwen2-rand-120m" + ("-fp32" if dtype == "float32" else "")
    )
    with open(os.path.join(args.peer_dir, "workload_64x128.json")) as f:
        spec = json.load(f)
    wl = Workload(
        spec["num_prompts"], spec["input_len"], spec["output_len"], args.max_num_batched_tokens
    )
    shape = model_shape(model)
    ckpt = checkpoint_params(model)
    mach = machine()
    print(f"machine: {mach}")
    print(f"model: {model} ({dtype})")
    print(f"params: {shape.params:,} from config.json, {ckpt or 0:,} in the checkpoint")
    print(f"workload: {wl}")
    tdtype = _DTYPES[dtype]
    gemm = measure_gemms(shape, wl, tdtype, args.reps)
    bw = measure_bandwidth(args.bw_mib, args.reps)
    _print_rates(shape, wl, gemm, bw)
    fl = floors(shape, wl, gemm, max(bw.values()), tdtype.itemsize)
    out_tokens = wl.num_prompts * wl.output_len
    _print_floor(fl, out_tokens)
    runs = []
    for tag in [t for t in args.engines.split(",") if t]:
        python = sys.executable if tag == "ours" else UPSTREAM_PY
        if tag != "ours" and not os.path.exists(python):
            runs.append(EngineRun(tag, False, error=f"{python} missing (../shared/peer/setup.sh)"))
            continue
        print(f"running {tag} ...", flush=True)
        runs.append(run_engine(tag, python, model, dtype, args))
    _print_runs(runs, fl, args.threads or mach["cores"])
    print(f"load average after: {os.getloadavg()}")
    if args.out:
        report = dict(
            machine=mach,
            threads=args.threads or mach["cores"],
            model=model,
            dtype=dtype,
            workload=asdict(wl),
            params_config=shape.params,
            params_checkpoint=ckpt,
            gemm_s=gemm,
            bandwidth=bw,
            floors=asdict(fl),
            engines=[asdict(r) for r in runs],
            date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        )
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
