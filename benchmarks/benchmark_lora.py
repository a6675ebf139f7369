"""Multi-LoRA offline throughput: a batch spread over 4 adapters against the
same batch on the base model, ours and (--compare-upstream) upstream vLLM.

    .venv/bin/python benchmarks/make_lora_adapters.py      # once: 4 peft adapters
    .venv/bin/python benchmarks/benchmark_lora.py [--dtypes float32,bfloat16] \\
        [--engines ours,upstream] [--compare-upstream] [--iters 3]

Model: the peer benchmark's random Qwen2 (~122M, Llama layout; /work/shared/
peer/make_model.py), bf16 and fp32 copies. Workload: --num-prompts prompts of
--input-len random ids (numpy default_rng(0), the peer workload's ids), greedy,
--output-len tokens each (ignore_eos), all in one batch (max_num_seqs =
num_prompts); in the LoRA batch prompt i uses adapter i % 4 (interleaved, the
worst layout for grouping tokens by adapter).

Per engine and dtype the driver starts two processes (one after the other):
- base: an engine without LoRA, one warm-up batch, --iters timed batches;
- lora: an engine with enable_lora (max_loras 4, max_lora_rank 16), one
  warm-up, then --iters rounds of (LoRA batch, the same batch without an
  adapter), so "base on the LoRA engine" is measured in the same spells.
Each batch runs the same number of engine steps (fixed output length), so the
wall-time ratio LoRA / base is the mean step-time ratio (the issue's goal:
<= 1.3x). Printed: median wall per batch, output tokens/s, CPU-seconds of the
process, the ratios, and for --compare-upstream ours / upstream and how many
greedy tokens of the LoRA batch agree. Both engines run in one process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), OMP_NUM_THREADS = core count unless set;
on a shared, oversubscribed machine run with OMP_NUM_THREADS=1 and read the
CPU-second figures (wall time then mostly measures the other jobs).
The worker (--worker) is this file under either interpreter, public API only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

PEER = os.path.expanduser("~/.cache/vllm-peer")
UPSTREAM = os.path.join(PEER, "upstream-venv/bin/python")
MODEL = os.path.join(PEER, "models/qwen2-rand-120m")
ADAPTERS = os.path.join(PEER, "models/qwen2-rand-120m-lora")
NUM_ADAPTERS, RANK = 4, 16


def make_prompts(n: int, length: int) -> list[list[int]]:
    """The peer workload's ids (workload.py): default_rng(0).integers(3, 32000)."""
    import numpy as np

    return np.random.default_rng(0).integers(3, 32000, size=(n, length)).tolist()


def _timed(llm: Any, prompts: list[Any], params: Any, loras: Any) -> tuple[float, float, Any]:
    """(wall s, own CPU s, outputs) of one generate call."""
    cpu0 = sum(os.times()[:2])
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
    return time.perf_counter() - t0, sum(os.times()[:2]) - cpu0, outs


def _requests(args: argparse.Namespace, n: int) -> list[Any]:
    from vllm.lora.request import LoRARequest

    reqs = [
        LoRARequest(f"a{i}", i + 1, os.path.join(args.adapters, f"a{i}"))
        for i in range(NUM_ADAPTERS)
    ]
    return [reqs[i % NUM_ADAPTERS] for i in range(n)]


def worker(args: argparse.Namespace) -> None:
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [
        TokensPrompt(prompt_token_ids=p) for p in make_prompts(args.num_prompts, args.input_len)
    ]
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True, temperature=0.0)
    lora = args.mode == "lora"
    kw: dict[str, Any] = dict(model=args.model, dtype=args.dtype, seed=0, max_model_len=512)
    kw.update(max_num_seqs=args.num_prompts, enforce_eager=args.enforce_eager)
    if lora:
        kw.update(enable_lora=True, max_loras=NUM_ADAPTERS, max_lora_rank=RANK)
    t0 = time.perf_counter()
    llm = LLM(**kw)
    init_s = time.perf_counter() - t0
    kinds = (
        {"lora": _requests(args, len(prompts)), "base_on_lora": None} if lora else {"base": None}
    )
    for loras in kinds.values():
        _timed(llm, prompts, params, loras)  # warm-up (compiles, loads the adapters)
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    outputs: dict[str, list[list[int]]] = {}
    for _ in range(args.iters):
        for kind, loras in kinds.items():
            wall, cpu, outs = _timed(llm, prompts, params, loras)
            runs[kind].append((wall, cpu))
            outputs[kind] = [list(o.outputs[0].token_ids) for o in outs]
    with open(args.out, "w") as f:
        json.dump(outputs, f)
    n_out = args.num_prompts * args.output_len
    res: dict[str, Any] = dict(version=vllm.__version__, init_s=round(init_s, 1))
    for kind, rows in runs.items():
        wall = statistics.median(w for w, _ in rows)
        res[kind] = dict(
            walls=[round(w, 3) for w, _ in rows],
            wall=wall,
            tok_s=n_out / wall,
            cpu=statistics.median(c for _, c in rows),
            tok_cpu_s=n_out / statistics.median(c for _, c in rows),
        )
    if lora:  # the adapters must change the greedy tokens, else nothing was measured
        res["lora_changes_tokens"] = outputs["lora"] != outputs["base_on_lora"]
    res["load1"] = os.getloadavg()[0]
    print("RESULT_JSON " + json.dumps(res), flush=True)


def _run_one(python: str, args: argparse.Namespace, dtype: str, mode: str, out: str) -> dict:
    model = args.model if dtype == "bfloat16" else args.model + "-fp32"
    cmd = [python, os.path.abspath(__file__), "--worker", "--model", model, "--dtype", dtype]
    cmd += ["--mode", mode, "--out", out, "--iters", str(args.iters), "--adapters", args.adapters]
    cmd += ["--num-prompts", str(args.num_prompts), "--input-len", str(args.input_len)]
    cmd += ["--output-len", str(args.output_len)] + (
        ["--enforce-eager"] if args.enforce_eager else []
    )
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1")
    env.update(VLLM_NO_USAGE_STATS="1", VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="2")
    env.setdefault("OMP_NUM_THREADS", str(os.cpu_count()))
    # From /tmp, so the upstream interpreter does not import this checkout's vllm/.
    proc = subprocess.run(cmd, env=env, cwd="/tmp", capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT_JSON "):
            return json.loads(line[len("RESULT_JSON ") :])
    raise RuntimeError(f"{python} {mode} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}")


def _agreement(a_path: str, b_path: str, kind: str) -> str:
    """Share of greedy tokens equal up to each sequence's first difference."""
    with open(a_path) as fa, open(b_path) as fb:
        a, b = json.load(fa)[kind], json.load(fb)[kind]
    same = total = 0
    for x, y in zip(a, b):
        total += len(x)
        same += next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), len(x))
    return f"{same}/{total}"


def _summary(dtype: str, res: dict[str, dict[str, dict]], files: dict[str, str]) -> None:
    for name, modes in res.items():
        base, lora = modes["base"]["base"], modes["lora"]["lora"]
        base_l = modes["lora"]["base_on_lora"]
        for label, r in (("base", base), ("base on LoRA engine", base_l), ("4 adapters", lora)):
            print(
                f"{dtype:9s} {name:9s} {label:20s} {r['wall']:7.2f} s/batch {r['tok_s']:7.1f} "
                f"out tok/s  CPU {r['cpu']:6.1f} s {r['tok_cpu_s']:6.1f} tok/CPU-s "
                f"(walls {r['walls']})"
            )
        print(
            f"{dtype:9s} {name:9s} LoRA/base: wall (step time) {lora['wall'] / base['wall']:.2f}, "
            f"CPU {lora['cpu'] / base['cpu']:.2f}; vs base on the LoRA engine: wall "
            f"{lora['wall'] / base_l['wall']:.2f}, CPU {lora['cpu'] / base_l['cpu']:.2f}; adapters "
            f"change tokens: {modes['lora']['lora_changes_tokens']}; init "
            f"{modes['base']['init_s']} / {modes['lora']['init_s']} s; "
            f"vllm {modes['base']['version']}"
        )
    if set(res) == {"ours", "upstream"}:
        o, u = res["ours"], res["upstream"]

        def ratio(mode: str, kind: str, key: str) -> float:
            return o[mode][kind][key] / u[mode][kind][key]

        print(
            f"{dtype:9s} ours/upstream: base {ratio('base', 'base', 'tok_s'):.2f} (tok/s), "
            f"{ratio('base', 'base', 'tok_cpu_s'):.2f} (tok/CPU-s); 4 adapters "
            f"{ratio('lora', 'lora', 'tok_s'):.2f} (tok/s), "
            f"{ratio('lora', 'lora', 'tok_cpu_s'):.2f} (tok/CPU-s); "
            "greedy tokens agreeing (LoRA batch) "
            f"{_agreement(files['ours'], files['upstream'], 'lora')}",
            flush=True,
        )


def driver(args: argparse.Namespace) -> None:
    pythons = {"ours": sys.executable, "upstream": args.upstream_python}
    engines = args.engines.split(",")
    tmp = tempfile.mkdtemp(prefix="lora_bench_")
    print(
        f"{args.num_prompts} prompts x {args.input_len} ids -> {args.output_len} tokens, "
        f"{NUM_ADAPTERS} adapters rank {RANK}, {args.iters} timed batches; {os.cpu_count()} CPUs, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', os.cpu_count())}",
        flush=True,
    )
    for dtype in args.dtypes.split(","):
        res: dict[str, dict[str, dict]] = {}
        files: dict[str, str] = {}
        for name in engines:
            for mode in ("base", "lora"):
                out = os.path.join(tmp, f"{name}_{dtype}_{mode}.json")
                r = _run_one(pythons[name], args, dtype, mode, out)
                print(f"{dtype} {name} {mode}: {json.dumps(r)}", flush=True)
                res.setdefault(name, {})[mode] = r
            files[name] = out
        _summary(dtype, res, files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=MODEL, help="bf16 dir; float32 uses <dir>-fp32")
    parser.add_argument("--adapters", default=ADAPTERS)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--engines", default="ours")
    parser.add_argument("--compare-upstream", action="store_true", help="--engines upstream,ours")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--upstream-python", default=UPSTREAM)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("base", "lora"), help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.compare_upstream:
        args.engines = "upstream,ours"
    worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    main()
