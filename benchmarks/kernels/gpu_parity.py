"""GPU check helper for benchmarks/gpu_check.sh (not run in CI: needs CUDA).

Builds a tiny random-weight Qwen2 checkpoint, then for each (runner,
attention backend, cudagraph_mode) generates greedy tokens for a fixed batch
and times the steady decode: prints one line per run, whether every run's
tokens match the first one's (greedy parity), and per runner the decode step
time with CUDA graphs against eager. Graph runs use TRITON_ATTN (CPU_ATTN has
no graph support and would resolve to eager); capture sizes stop at 64.

    python benchmarks/kernels/gpu_parity.py --workdir /tmp/gpu_check
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def make_model(path: str) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=4096,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        torch_dtype="bfloat16",
    )
    Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)


# (attention backend, cudagraph_mode); "eager" = enforce_eager.
CONFIGS = [
    ("TRITON_ATTN", "eager"),
    ("TRITON_ATTN", "FULL_DECODE_ONLY"),
    ("TRITON_ATTN", "FULL"),
    # VLLM_COMPILE (the graph split at attention): decode steps replay full
    # graphs, mixed ones the pieces' graphs (Inductor compiles each piece).
    ("TRITON_ATTN", "FULL_AND_PIECEWISE"),
    ("CPU_ATTN", "eager"),
]


def run_one(model: str, backend: str, v2: bool, graphs: str, num_seqs: int, out_len: int) -> dict:
    """Generate in this process (the caller sets the env before import)."""
    import torch

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    cc: dict = {"cudagraph_mode": graphs, "max_cudagraph_capture_size": 64}
    if "PIECEWISE" in graphs:
        cc["mode"] = 3  # VLLM_COMPILE
    kwargs = dict(enforce_eager=True) if graphs == "eager" else dict(compilation_config=cc)
    t0 = time.perf_counter()
    llm = LLM(
        model=model,
        dtype="bfloat16",
        max_model_len=1024,
        seed=0,
        skip_tokenizer_init=True,
        **kwargs,
    )
    init_s = time.perf_counter() - t0
    g = torch.Generator().manual_seed(0)
    prompts = [
        TokensPrompt(prompt_token_ids=torch.randint(10, 4000, (64,), generator=g).tolist())
        for _ in range(num_seqs)
    ]
    sp = SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True, detokenize=False)
    sp1 = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False)
    llm.generate(prompts, sp, use_tqdm=False)  # warm-up

    def timed(params: SamplingParams) -> tuple[float, list]:
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        t = time.perf_counter()
        res = llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - t, res

    prefill_s = min(timed(sp1)[0] for _ in range(3))
    wall, outs = timed(sp)
    # Steady decode: the whole run less a prefill-only run, per decode step.
    step_ms = 1e3 * (wall - prefill_s) / max(1, out_len - 1)
    return {
        "backend": backend,
        "v2": v2,
        "graphs": graphs,
        "init_s": round(init_s, 1),
        "wall_s": round(wall, 3),
        "ms_per_decode_step": round(step_ms, 3),
        "tokens": [o.outputs[0].token_ids for o in outs],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", default="/tmp/gpu_check")
    ap.add_argument("--child", default="")
    ap.add_argument("--num-seqs", type=int, default=32)
    ap.add_argument("--out-len", type=int, default=64)
    ap.add_argument("--child-timeout", type=float, default=300.0)
    a = ap.parse_args()
    model = os.path.join(a.workdir, "qwen2-tiny")
    if a.child:
        backend, v2, graphs = a.child.split(":")
        print(
            "RESULT "
            + json.dumps(run_one(model, backend, v2 == "1", graphs, a.num_seqs, a.out_len))
        )
        return
    if not os.path.exists(os.path.join(model, "config.json")):
        make_model(model)
    results = [
        r
        for v2 in ("0", "1")
        for backend, graphs in CONFIGS
        if (r := _run_child(a, backend, v2, graphs)) is not None
    ]
    if results:
        _report(results)


def _run_child(a: argparse.Namespace, backend: str, v2: str, graphs: str) -> dict | None:
    env = dict(
        os.environ,
        VLLM_ATTENTION_BACKEND=backend,
        VLLM_USE_V2_MODEL_RUNNER=v2,
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
    )
    try:
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--workdir",
                a.workdir,
                "--child",
                f"{backend}:{v2}:{graphs}",
                "--num-seqs",
                str(a.num_seqs),
                "--out-len",
                str(a.out_len),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=a.child_timeout,
        )
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        print(f"{backend} v2={v2} {graphs}: TIMED OUT after {a.child_timeout:.0f} s\n{err[-1500:]}")
        return None
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not line:
        print(f"{backend} v2={v2} {graphs}: FAILED\n{proc.stderr[-2500:]}")
        return None
    r = json.loads(line[0][7:])
    print(
        f"{backend:12s} v2={v2} {graphs:17s}: {r['ms_per_decode_step']:8.3f} ms/decode step "
        f"(batch {a.num_seqs}; LLM() {r['init_s']} s)"
    )
    return r


def _report(results: list[dict]) -> None:
    """Greedy parity of every run against the first; graphs-on step time
    against eager for each runner."""
    ref = results[0]
    for r in results[1:]:
        same = sum(x == y for x, y in zip(r["tokens"], ref["tokens"]))
        print(
            f"greedy parity {r['backend']} v2={r['v2']} {r['graphs']} vs {ref['backend']} "
            f"v2={ref['v2']} {ref['graphs']}: {same}/{len(ref['tokens'])} sequences identical"
        )
    for v2 in (False, True):
        runs = {r["graphs"]: r for r in results if r["v2"] == v2 and r["backend"] == "TRITON_ATTN"}
        eager = runs.get("eager")
        for mode in ("FULL_DECODE_ONLY", "FULL", "FULL_AND_PIECEWISE"):
            if eager and mode in runs:
                same = runs[mode]["tokens"] == eager["tokens"]
                print(
                    f"v2={v2} {mode}: {runs[mode]['ms_per_decode_step']:.3f} vs eager "
                    f"{eager['ms_per_decode_step']:.3f} ms/decode step "
                    f"({eager['ms_per_decode_step'] / runs[mode]['ms_per_decode_step']:.2f}x), "
                    f"tokens {'identical' if same else 'DIFFER'}"
                )


if __name__ == "__main__":
    main()
