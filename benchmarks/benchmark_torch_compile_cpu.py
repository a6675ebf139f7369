"""Does torch.compile of the model forward help on CPU? Eager vs compiled,
through the real Worker and V1 model runner.

Each mode runs in its own process (fresh dynamo state, and a fresh Inductor
cache directory so the compile time is a cold one):
1. load the model as the runner does, then `maybe_compile_model` (the call a
   runner's load_model would make) for the compiled modes;
2. one prefill step of `--batch-size` prompts, then decode steps over the
   whole batch (the first `--warmup` of them untimed);
3. prefill-only steps of `--prefill-reqs` x `--prefill-len` new tokens.
Step times are wall time, or with `--clock cpu` the process's CPU time (with
`--threads 1` a measure that other load on a shared machine barely moves).
The first compiled forward's wall time is the compile time (trace + Inductor
codegen + C++ build); `unique_graphs` counts the graphs dynamo built (1 means
no recompile across the batch sizes seen).

    python benchmarks/benchmark_torch_compile_cpu.py \\
        --model ~/.cache/vllm-peer/models/qwen2-rand-120m --modes none,stock

Measured (120M bf16 Qwen2, 2-core AVX-512 box shared with other jobs, torch
2.13, `--threads 1 --clock cpu --rounds 2`): decode step at batch 64 39.1 ms
eager vs 45.1 ms compiled (x0.87), prefill step of 4 x 256 tokens 405 ms vs
429 ms (x0.94), cold compile ~27-31 s. Compiling does not help here: the
elementwise work already runs in the fused C++ ops (opaque to Inductor) and
the GEMMs in oneDNN either way, so CPU stays eager by default.
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

DEFAULT_MODEL = os.path.expanduser("~/.cache/vllm-peer/models/qwen2-rand-120m")
MODES = {"none": "NONE", "stock": "STOCK_TORCH_COMPILE", "vllm": "VLLM_COMPILE"}
BLOCK_SIZE = 16


class Driver:
    """Sends V1-form SchedulerOutputs to a Worker: new requests prefilled in
    one step, then decode steps over every live request."""

    def __init__(self, worker, num_blocks: int, clock=time.perf_counter) -> None:
        self.worker = worker
        self.clock = clock
        self.free_blocks = list(range(1, num_blocks))  # block 0 is the null block
        self.reqs: dict[str, dict] = {}
        self.finished: set[str] = set()

    def _blocks_for(self, req: dict, num_tokens: int) -> list[int]:
        need = -(-num_tokens // BLOCK_SIZE) - len(req["blocks"])
        if need > len(self.free_blocks):
            raise RuntimeError("benchmark ran out of KV blocks; raise --num-blocks")
        new, self.free_blocks = self.free_blocks[:need], self.free_blocks[need:]
        req["blocks"] += new
        return new

    def _run(self, new_reqs, cached, schedule: dict[str, int]) -> float:
        from vllm.v1.core.sched.output import SchedulerOutput

        so = SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=schedule,
            total_num_scheduled_tokens=sum(schedule.values()),
            scheduled_spec_decode_tokens={},
            scheduled_encoder_inputs={},
            num_common_prefix_blocks=[0],
            finished_req_ids=self.finished,
            free_encoder_mm_hashes=[],
        )
        self.finished = set()
        start = self.clock()
        self.worker.execute_model(so)
        out = self.worker.sample_tokens(None)
        elapsed = self.clock() - start
        for rid, n in schedule.items():
            req = self.reqs[rid]
            req["computed"] += n
            req["outputs"] += out.sampled_token_ids[out.req_id_to_index[rid]]
        return elapsed

    def prefill(self, prompts: dict[str, list[int]]) -> float:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.core.sched.output import CachedRequestData, NewRequestData

        greedy = SamplingParams(temperature=0.0, max_tokens=1 << 20, ignore_eos=True)
        new_reqs = []
        for rid, prompt in prompts.items():
            req = self.reqs[rid] = dict(prompt=prompt, outputs=[], computed=0, blocks=[])
            self._blocks_for(req, len(prompt))
            new_reqs.append(
                NewRequestData(
                    req_id=rid,
                    prompt_token_ids=prompt,
                    mm_features=[],
                    sampling_params=greedy,
                    pooling_params=None,
                    block_ids=(list(req["blocks"]),),
                    num_computed_tokens=0,
                    lora_request=None,
                )
            )
        return self._run(
            new_reqs, CachedRequestData.make_empty(), {rid: len(p) for rid, p in prompts.items()}
        )

    def decode(self) -> float:
        from vllm.v1.core.sched.output import CachedRequestData

        cached = CachedRequestData.make_empty()
        for rid, req in self.reqs.items():
            new = self._blocks_for(req, req["computed"] + 1)
            cached.req_ids.append(rid)
            cached.new_block_ids.append((new,) if new else None)
            cached.num_computed_tokens.append(req["computed"])
            cached.num_output_tokens.append(len(req["outputs"]))
        return self._run([], cached, {rid: 1 for rid in self.reqs})

    def finish_all(self) -> None:
        for rid, req in self.reqs.items():
            self.free_blocks += req["blocks"]
            self.finished.add(rid)
        self.reqs = {}


def _prompts(prefix: str, n: int, length: int, vocab: int, seed: int) -> dict[str, list[int]]:
    import random

    rng = random.Random(seed)
    return {f"{prefix}{i}": [rng.randrange(1, vocab) for _ in range(length)] for i in range(n)}


def run_one(args: argparse.Namespace) -> dict:
    """One mode, in this process: returns its timings."""
    import torch
    from torch._dynamo.utils import counters

    from vllm.compilation.decorators import maybe_compile_model
    from vllm.config.compilation import CompilationMode
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
    from vllm.v1.worker.gpu_worker import Worker

    config = EngineArgs(
        model=args.model,
        dtype=args.dtype,
        max_model_len=2048,
        block_size=BLOCK_SIZE,
        max_num_seqs=max(args.batch_size, 8),
        max_num_batched_tokens=8192,
        device="cpu",
        enable_prefix_caching=False,
        kv_cache_memory_bytes=1 << 30,
    ).create_engine_config()
    worker = Worker(config)
    worker.init_device()
    if args.threads:
        torch.set_num_threads(args.threads)
    worker.load_model()
    runner = worker.model_runner
    config.compilation_config.mode = CompilationMode[MODES[args.one_mode]]
    runner.model = maybe_compile_model(
        runner.model, config.compilation_config, "cpu", backend=args.backend
    )
    specs = worker.get_kv_cache_spec()
    names = sorted(specs)
    spec = specs[names[0]]
    worker.initialize_from_config(
        KVCacheConfig(
            num_blocks=args.num_blocks,
            kv_cache_tensors=[
                KVCacheTensor(size=spec.page_size_bytes * args.num_blocks, shared_by=[n])
                for n in names
            ],
            kv_cache_groups=[KVCacheGroupSpec(layer_names=names, kv_cache_spec=spec)],
        )
    )
    vocab = config.model_config.hf_config.vocab_size
    driver = Driver(
        worker, args.num_blocks, time.process_time if args.clock == "cpu" else time.perf_counter
    )
    first_step = driver.prefill(_prompts("d", args.batch_size, args.prompt_len, vocab, 0))
    decode = [driver.decode() for _ in range(args.warmup + args.decode_steps)][args.warmup :]
    decode_tokens = [r["outputs"][:8] for r in driver.reqs.values()][:2]
    driver.finish_all()
    prefill = []
    for rep in range(args.warmup_prefill + args.prefill_repeats):
        t = driver.prefill(_prompts(f"p{rep}-", args.prefill_reqs, args.prefill_len, vocab, rep))
        driver.finish_all()
        prefill.append(t)
    forward = runner.model.forward
    return dict(
        mode=MODES[args.one_mode],
        backend=args.backend or "inductor",
        clock=args.clock,
        torch_threads=torch.get_num_threads(),
        compile_s=getattr(forward, "first_call_s", None),
        first_step_s=first_step,
        decode_step_ms_median=1e3 * statistics.median(decode),
        decode_step_ms_min=1e3 * min(decode),
        prefill_step_ms_median=1e3 * statistics.median(prefill[args.warmup_prefill :]),
        prefill_step_ms_min=1e3 * min(prefill[args.warmup_prefill :]),
        unique_graphs=counters["stats"]["unique_graphs"],
        graph_breaks=sum(counters["graph_break"].values()),
        first_decode_tokens=decode_tokens,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--modes", default="none,stock", help=f"comma list of {sorted(MODES)}")
    p.add_argument("--backend", default=None, help="torch.compile backend (default inductor)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--decode-steps", type=int, default=30)
    p.add_argument("--prefill-reqs", type=int, default=4)
    p.add_argument("--prefill-len", type=int, default=256)
    p.add_argument("--warmup-prefill", type=int, default=2)
    p.add_argument("--prefill-repeats", type=int, default=5)
    p.add_argument("--num-blocks", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=2, help="eager/compiled alternations")
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads (0: the worker's choice, one per usable core)",
    )
    p.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: the process's CPU time per step, which other load on a "
        "shared machine barely moves (use with --threads 1)",
    )
    p.add_argument("--one-mode", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one_mode is not None:
        print("RESULT " + json.dumps(run_one(args)), flush=True)
        return
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")  # the driver speaks V1 form
    modes = args.modes.split(",")
    for mode in modes:
        if mode not in MODES:
            raise SystemExit(f"unknown mode {mode!r}; choose from {sorted(MODES)}")
    # Modes alternate within each round, so that load from other processes
    # on a shared machine hits them alike.
    results: dict[str, list[dict]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for mode in modes:
            results[mode].append(_run_in_subprocess(mode))
            print(json.dumps(results[mode][-1]), flush=True)
    base = _summary(results[modes[0]])
    print(f"{modes[0]}: {base}")
    for mode in modes[1:]:
        s = _summary(results[mode])
        print(f"{mode}: {s}")
        print(
            f"{mode} vs {modes[0]} (>1 = faster): decode x"
            f"{base['decode_ms'] / s['decode_ms']:.2f} (min x"
            f"{base['decode_min_ms'] / s['decode_min_ms']:.2f}), prefill x"
            f"{base['prefill_ms'] / s['prefill_ms']:.2f} (min x"
            f"{base['prefill_min_ms'] / s['prefill_min_ms']:.2f}), "
            f"cold compile {s['compile_s']:.1f} s"
        )


def _run_in_subprocess(mode: str) -> dict:
    with tempfile.TemporaryDirectory() as cache_dir:  # a cold Inductor cache
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir)
        proc = subprocess.run(
            [sys.executable, __file__, *sys.argv[1:], "--one-mode", mode],
            env=env,
            capture_output=True,
            text=True,
        )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"mode {mode} failed:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def _summary(runs: list[dict]) -> dict:
    """Median over rounds of each round's median step time, and the fastest
    step seen (the least disturbed by other load on a shared machine)."""
    compile_s = [r["compile_s"] for r in runs if r["compile_s"] is not None]
    return dict(
        decode_ms=round(statistics.median(r["decode_step_ms_median"] for r in runs), 1),
        decode_min_ms=round(min(r["decode_step_ms_min"] for r in runs), 1),
        prefill_ms=round(statistics.median(r["prefill_step_ms_median"] for r in runs), 1),
        prefill_min_ms=round(min(r["prefill_step_ms_min"] for r in runs), 1),
        compile_s=round(statistics.median(compile_s), 1) if compile_s else 0.0,
    )


if __name__ == "__main__":
    main()
