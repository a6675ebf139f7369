"""Offline embedding throughput, ours vs upstream vLLM, on a BERT-base-sized
sentence-transformers checkpoint (benchmarks/make_bert_checkpoint.py).

    python benchmarks/make_bert_checkpoint.py
    .venv/bin/python benchmarks/benchmark_pooling_peer.py \\
        [--model DIR] [--dtypes float32,bfloat16] [--repeats 3] [--num-prompts 256]

The driver (default mode) starts one process per measurement, alternating
ours and upstream (~/.cache/vllm-peer/upstream-venv, see /work/shared/peer)
and swapping which goes first every repeat, so both see the same spells of
load on a shared machine. Each process (--worker, the same file under either
interpreter, public API only: LLM(model, runner="pooling").embed on
TokensPrompt's) builds the engine, warms up on 8 prompts, times --iters full
passes and prints one RESULT_JSON line; its embeddings go to an .npy file.
Both engines run in one process (VLLM_ENABLE_V1_MULTIPROCESSING=0) with
OMP_NUM_THREADS = the core count, upstream's fastest setting here.

The workload: --num-prompts prompts of [CLS] + random ids + [SEP], lengths
drawn uniformly from [--min-len, --max-len] (random.Random(0), so both
interpreters build the same ids). Reported per dtype: the median over repeats
of each process's median pass (prompt tokens/s and texts/s), prompt tokens
per CPU-second of the engine's own process (user + system time: on a shared
machine the wall-clock figure also measures how much CPU each engine wins
from the others), the ratios ours / upstream, the median foreign CPU share
during the timed passes (CPU time of other processes / all CPU time
available, from /proc/stat), and the cosine of our vectors against
upstream's (min and mean over all prompts).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

CLS_ID, SEP_ID = 101, 102  # bert-base-uncased's ids (make_bert_checkpoint.py's too)
UPSTREAM = os.path.expanduser("~/.cache/vllm-peer/upstream-venv/bin/python")
DEFAULT_MODEL = os.path.expanduser("~/.cache/vllm-peer/models/bert-base-st")


def make_prompts(n: int, min_len: int, max_len: int, seed: int = 0) -> list[list[int]]:
    """n id lists, each [CLS] + uniform ids from [1000, 30000) + [SEP]."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        body = rng.randint(min_len, max_len) - 2
        out.append([CLS_ID, *(rng.randrange(1000, 30000) for _ in range(body)), SEP_ID])
    return out


def _busy_jiffies() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine from /proc/stat's first
    line: user nice system idle iowait irq softirq steal (in USER_HZ ticks)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = ticks[3] + ticks[4]
    return (sum(ticks) - idle) / hz, sum(ticks) / hz


def _timed_pass(llm: Any, prompts: list[Any]) -> tuple[float, float, float, list[Any]]:
    """(wall seconds, foreign CPU share, own CPU seconds, outputs) of one full
    embed pass (own = this process's user + system time; the engine runs in
    this process)."""
    busy0, total0 = _busy_jiffies()
    own0 = sum(os.times()[:2])
    start = time.perf_counter()
    outs = llm.embed(prompts, use_tqdm=False)
    wall = time.perf_counter() - start
    busy1, total1 = _busy_jiffies()
    own = sum(os.times()[:2]) - own0
    foreign = (busy1 - busy0) - own
    return wall, max(0.0, foreign) / max(total1 - total0, 1e-9), own, outs


def worker(args: argparse.Namespace) -> None:
    import numpy as np

    import vllm
    from vllm import LLM
    from vllm.inputs import TokensPrompt

    ids = make_prompts(args.num_prompts, args.min_len, args.max_len)
    prompts = [TokensPrompt(prompt_token_ids=x) for x in ids]
    t0 = time.perf_counter()
    llm = LLM(model=args.model, runner="pooling", dtype=args.dtype, max_model_len=512, seed=0)
    init_s = time.perf_counter() - t0
    llm.embed(prompts[:8], use_tqdm=False)  # warm-up
    walls, foreign, cpu = [], [], []
    for _ in range(args.iters):
        wall, share, own, outs = _timed_pass(llm, prompts)
        walls.append(wall)
        foreign.append(share)
        cpu.append(own)
    vecs = np.array([o.outputs.embedding for o in outs], dtype=np.float32)
    np.save(args.out, vecs)
    wall = statistics.median(walls)
    res = dict(
        version=vllm.__version__,
        dtype=args.dtype,
        init_s=round(init_s, 1),
        walls=[round(w, 3) for w in walls],
        tok_s=sum(map(len, ids)) / wall,
        texts_s=len(ids) / wall,
        foreign=statistics.median(foreign),
        tok_cpu_s=sum(map(len, ids)) / statistics.median(cpu),
        load1=os.getloadavg()[0],
    )
    print("RESULT_JSON " + json.dumps(res), flush=True)


def _run_one(python: str, args: argparse.Namespace, dtype: str, out: str) -> dict[str, Any]:
    cmd = [python, os.path.abspath(__file__), "--worker", "--model", args.model]
    cmd += ["--dtype", dtype, "--out", out, "--iters", str(args.iters)]
    cmd += ["--num-prompts", str(args.num_prompts)]
    cmd += ["--min-len", str(args.min_len), "--max-len", str(args.max_len)]
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1")
    env.update(VLLM_NO_USAGE_STATS="1", VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="2")
    env.setdefault("OMP_NUM_THREADS", str(os.cpu_count()))
    # From /tmp, so the upstream interpreter does not import this checkout's vllm/.
    proc = subprocess.run(cmd, env=env, cwd="/tmp", capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT_JSON "):
            return json.loads(line[len("RESULT_JSON ") :])
    raise RuntimeError(f"{python} --worker failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def _cosines(a_path: str, b_path: str) -> tuple[float, float]:
    import numpy as np

    a, b = np.load(a_path), np.load(b_path)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float(cos.min()), float(cos.mean())


def _summary(dtype: str, rows: dict[str, list[dict[str, Any]]], cos: tuple[float, float]) -> None:
    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[name])

    for name, runs in rows.items():
        per_run = ", ".join(f"{r['tok_s']:.0f}" for r in runs)
        print(
            f"{dtype:9s} {name:9s} {med(name, 'tok_s'):8.0f} tok/s "
            f"{med(name, 'texts_s'):6.2f} texts/s {med(name, 'tok_cpu_s'):6.0f} tok/CPU-s "
            f"(runs: {per_run}; init {runs[0]['init_s']} s; foreign CPU "
            f"{med(name, 'foreign'):.0%}; vllm {runs[0]['version']})"
        )
    ratio = med("ours", "tok_s") / med("upstream", "tok_s")
    cpu_ratio = med("ours", "tok_cpu_s") / med("upstream", "tok_cpu_s")
    print(
        f"{dtype:9s} ratio ours/upstream {ratio:.2f} (tok/s), {cpu_ratio:.2f} (tok/CPU-s); "
        f"cosine ours vs upstream min {cos[0]:.6f} mean {cos[1]:.6f}",
        flush=True,
    )


def driver(args: argparse.Namespace) -> None:
    engines = {"ours": sys.executable, "upstream": args.upstream_python}
    tmp = tempfile.mkdtemp(prefix="pooling_peer_")
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for rep in range(args.repeats):
        for dtype in args.dtypes.split(","):
            order = list(engines) if rep % 2 == 0 else list(engines)[::-1]
            for name in order:
                out = os.path.join(tmp, f"{name}_{dtype}.npy")
                res = _run_one(engines[name], args, dtype, out)
                results.setdefault(dtype, {}).setdefault(name, []).append(res)
                print(f"[repeat {rep + 1}] {dtype} {name}: {json.dumps(res)}", flush=True)
    prompts = make_prompts(args.num_prompts, args.min_len, args.max_len)
    print(
        f"\n{args.model}: {args.num_prompts} prompts, {sum(map(len, prompts))} tokens "
        f"({args.min_len}-{args.max_len} each), {args.repeats} processes x "
        f"{args.iters} passes per engine, medians; {os.cpu_count()} CPUs"
    )
    for dtype, rows in results.items():
        cos = _cosines(*(os.path.join(tmp, f"{n}_{dtype}.npy") for n in ("ours", "upstream")))
        _summary(dtype, {n: rows[n] for n in engines}, cos)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iters", type=int, default=2, help="timed passes per process")
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--min-len", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--upstream-python", default=UPSTREAM)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    main()
