"""The GPU path at real size against the device's limits (issue 22 item 1).

Builds a random-weight checkpoint of a real shape on the machine itself (a
config.json only: `load_format="dummy"` fills the weights on the device, no
download, no 16 GB write), then, one engine per child process, measures:

- decode step time at batch 1, 8, 32, 128, 256 over 1k-token contexts: the
  time of a run of 1 + S output tokens less that of a 1-token run, over S
  (prefix caching off, so both runs prefill the same);
- prefill step time for one prompt of 2k, 4k and 8k tokens (one step each:
  max_num_batched_tokens 8k);

under each (runner, graph mode) of the plan, and prints every figure next to
its floor: decode reads the weights and the batch's KV cache once per step
(bytes / HBM bandwidth); prefill is compute bound (FLOPs / dense bf16 peak).
With --throughput, `vllm bench throughput` on random 1k -> 256 prompts too.

    python benchmarks/gpu_real_size.py --workdir /tmp/real        # H200, Llama-3-8B
    python benchmarks/gpu_real_size.py --model tiny --device cpu  # smoke run (CI test)

Plan items are "runner:graphs[:attention backend]". Graph modes: "eager"
(enforce_eager), "FULL_DECODE_ONLY" (the default under compilation mode
NONE), "FULL_AND_PIECEWISE" (VLLM_COMPILE: full decode graphs and piecewise
mixed ones; the pieces compiled by Inductor). The backend is the platform's
choice unless named (TRITON_ATTN, FLASHINFER); when flashinfer imports, the
default plan adds V2 FULL_AND_PIECEWISE on FLASHINFER, for the choice of the
default backend by measurement. Capture sizes are the measured batch sizes
only, to keep the start-up short.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from roofline_floors import ModelShape, model_shape  # noqa: E402

# H200 SXM: HBM3e bandwidth and dense bf16 tensor-core peak (NVIDIA's figures).
H200_HBM_BYTES_PER_S = 4.8e12
H200_BF16_FLOPS = 989e12

CONFIGS = {
    "llama3-8b": dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        hidden_act="silu",
        tie_word_embeddings=False,
        bos_token_id=128000,
        eos_token_id=128001,
        torch_dtype="bfloat16",
    ),
    "tiny": dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        hidden_act="silu",
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="float32",
    ),
}

# (runner, graph mode) per child, most telling first: a killed run still
# reports the ones before it.
PLAN = [
    ("v2", "FULL_AND_PIECEWISE"),
    ("v2", "eager"),
    ("v1", "FULL_AND_PIECEWISE"),
    ("v1", "eager"),
    ("v2", "FULL_DECODE_ONLY"),
]


def write_config(path: str, name: str) -> str:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(CONFIGS[name], f, indent=1)
    return path


def decode_floor_ms(shape: ModelShape, batch: int, ctx: int, esize: int = 2) -> float:
    """One decode step reads every linear weight (LM head included) and the
    batch's KV cache once: bytes over HBM bandwidth."""
    weights = shape.linear_params() * esize
    kv = batch * ctx * shape.kv_elems_per_token() * esize
    return 1e3 * (weights + kv) / H200_HBM_BYTES_PER_S


def prefill_flops(shape: ModelShape, prompt_len: int) -> float:
    """FLOPs of prefilling one prompt: 2 per MAC in the body linears for every
    token, the LM head for the last token only, causal attention (QK^T and
    PV over on average half the prompt)."""
    lm_head = shape.hidden * shape.vocab
    body = shape.linear_params() - lm_head
    attn = 4 * shape.layers * shape.heads * shape.head_dim * prompt_len * prompt_len / 2
    return 2 * body * prompt_len + 2 * lm_head + attn


def prefill_floor_ms(shape: ModelShape, prompt_len: int) -> float:
    return 1e3 * prefill_flops(shape, prompt_len) / H200_BF16_FLOPS


# ---- one child: one engine -----------------------------------------------------------
def _engine(a: argparse.Namespace, graphs: str):
    from vllm import LLM

    cc: dict = {"cudagraph_capture_sizes": sorted(set(a.batches))}
    if graphs != "eager":
        cc["cudagraph_mode"] = graphs
        if "PIECEWISE" in graphs:
            cc["mode"] = 3  # VLLM_COMPILE: the graph split piecewise graphs need
    return LLM(
        model=a.model_dir,
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="bfloat16" if a.device == "cuda" else "float32",
        max_model_len=max(a.ctx + a.decode_steps, max(a.prefill)) + 8,
        max_num_seqs=max(a.batches),
        max_num_batched_tokens=max(max(a.prefill), max(a.batches)),
        enable_prefix_caching=False,
        enforce_eager=graphs == "eager",
        compilation_config=cc,
        seed=0,
        **({"gpu_memory_utilization": 0.9} if a.device == "cuda" else {}),
    )


def _timed(llm, prompts, max_tokens: int) -> float:
    import torch

    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    llm.generate(prompts, sp, use_tqdm=False)
    return time.perf_counter() - start


def _prompts(n: int, length: int, vocab: int, seed: int) -> list:
    import torch

    from vllm.inputs import TokensPrompt

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, vocab - 10, (n, length), generator=g).tolist()
    return [TokensPrompt(prompt_token_ids=p) for p in ids]


def run_child(a: argparse.Namespace, runner: str, graphs: str) -> dict:
    start = time.perf_counter()
    llm = _engine(a, graphs)
    init_s = time.perf_counter() - start
    worker = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker
    groups = worker.model_runner.attn_groups
    backend = groups[0][0].backend.get_name() if groups and groups[0] else "?"
    vocab = CONFIGS[a.model]["vocab_size"]
    _timed(llm, _prompts(2, min(64, a.ctx), vocab, 0), 4)  # warm-up
    decode = {}
    for b in a.batches:
        prompts = _prompts(b, a.ctx, vocab, b)
        one = _timed(llm, prompts, 1)
        many = _timed(llm, prompts, 1 + a.decode_steps)
        decode[b] = 1e3 * max(many - one, 0.0) / a.decode_steps
    prefill = {}
    for t in a.prefill:
        prompts = _prompts(1, t, vocab, t)
        prefill[t] = 1e3 * min(_timed(llm, prompts, 1) for _ in range(3))
    return dict(
        runner=runner,
        graphs=graphs,
        backend=backend,
        init_s=init_s,
        decode_ms=decode,
        prefill_ms=prefill,
    )


# ---- the parent: the plan, the floors, the report ------------------------------------
def _spawn(a: argparse.Namespace, runner: str, graphs: str, backend: str) -> dict | None:
    env = dict(
        os.environ,
        VLLM_USE_V2_MODEL_RUNNER="1" if runner == "v2" else "0",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
    )
    if backend:
        env["VLLM_ATTENTION_BACKEND"] = backend
    cmd = [sys.executable, __file__, "--child", f"{runner}:{graphs}:{backend}", *a.passthrough]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.child_timeout)
    except subprocess.TimeoutExpired:
        print(f"{runner} {graphs} {backend}: TIMED OUT after {a.child_timeout:.0f} s", flush=True)
        return None
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        print(f"{runner} {graphs} {backend}: FAILED\n{proc.stderr[-3000:]}", flush=True)
        return None
    return json.loads(lines[-1][7:])


def report(r: dict, shape: ModelShape, ctx: int) -> list[str]:
    """One line per figure: measured, floor, floor / measured."""
    out = [f"{r['runner']} {r['graphs']} {r['backend']}: engine up in {r['init_s']:.1f} s"]
    for b, ms in r["decode_ms"].items():
        floor = decode_floor_ms(shape, int(b), ctx)
        out.append(
            f"  decode b={int(b):4d} ctx={ctx}: {ms:8.3f} ms/step  floor {floor:7.3f} ms "
            f"(HBM)  {floor / ms if ms else 0:5.1%} of the limit"
        )
    for t, ms in r["prefill_ms"].items():
        floor = prefill_floor_ms(shape, int(t))
        out.append(
            f"  prefill {int(t):5d} tokens: {ms:8.2f} ms ({int(t) / ms * 1e3:9.0f} tok/s)  "
            f"floor {floor:7.2f} ms (bf16 peak)  {floor / ms if ms else 0:5.1%}"
        )
    return out


def _throughput(a: argparse.Namespace) -> None:
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "throughput",
        "--model", a.model_dir, "--load-format", "dummy", "--skip-tokenizer-init",
        "--dataset-name", "random", "--input-len", str(a.ctx), "--output-len", "256",
        "--num-prompts", str(a.throughput_prompts), "--dtype",
        "bfloat16" if a.device == "cuda" else "float32",
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.child_timeout)
        text = proc.stdout + proc.stderr
        print("\n".join(x for x in text.splitlines() if "Throughput" in x) or text[-2000:])
    except subprocess.TimeoutExpired:
        print(f"bench throughput: TIMED OUT after {a.child_timeout:.0f} s")


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default="/tmp/gpu_real_size")
    ap.add_argument("--model", choices=sorted(CONFIGS), default="llama3-8b")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128, 256])
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--prefill", type=int, nargs="+", default=[2048, 4096, 8192])
    ap.add_argument("--plan", nargs="+", default=[f"{r}:{g}" for r, g in PLAN])
    ap.add_argument("--child-timeout", type=float, default=240.0)
    ap.add_argument("--throughput", action="store_true")
    ap.add_argument("--throughput-prompts", type=int, default=500)
    ap.add_argument("--json", default="", help="write every result here")
    ap.add_argument("--child", default="")
    a = ap.parse_args()
    a.model_dir = os.path.join(a.workdir, a.model)
    if a.plan == [f"{r}:{g}" for r, g in PLAN] and importlib.util.find_spec("flashinfer"):
        a.plan.insert(1, "v2:FULL_AND_PIECEWISE:FLASHINFER")
    # What a child needs to rebuild this namespace.
    a.passthrough = [
        "--workdir", a.workdir, "--model", a.model, "--device", a.device,
        "--ctx", str(a.ctx), "--decode-steps", str(a.decode_steps),
        "--batches", *map(str, a.batches), "--prefill", *map(str, a.prefill),
    ]  # fmt: skip
    return a


def main() -> None:
    a = _parse()
    if a.child:
        runner, graphs = a.child.split(":")[:2]
        print("RESULT " + json.dumps(run_child(a, runner, graphs)), flush=True)
        return
    write_config(a.model_dir, a.model)
    shape = model_shape(a.model_dir)
    print(
        f"{a.model}: {shape.params / 1e9:.2f} B parameters, linears "
        f"{shape.linear_params() * 2 / 1e9:.2f} GB in bf16; KV "
        f"{shape.kv_elems_per_token() * 2 / 1024:.0f} KiB per token",
        flush=True,
    )
    results = []
    for item in a.plan:
        runner, graphs, backend = (item.split(":") + [""])[:3]
        r = _spawn(a, runner, graphs, backend)
        if r is not None:
            results.append(r)
            print("\n".join(report(r, shape, a.ctx)), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    if a.throughput:
        _throughput(a)


if __name__ == "__main__":
    main()
