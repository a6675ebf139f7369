"""Decode speed and weight bytes of one model served unquantized (fp32, bf16)
and as compressed-tensors W8A16 / W4A16 copies written here, or of a .gguf
file served kept quantized against the same model dequantized.

    python benchmarks/benchmark_quantized_decode.py --model HF_DIR
    python benchmarks/benchmark_quantized_decode.py --build-llama /tmp/llama-100m
    python benchmarks/benchmark_quantized_decode.py --gguf FILE.gguf --variants fp32 bf16 gguf

`--gguf FILE` (a Llama-architecture .gguf, e.g. the embedded SmolLM2 Q4_1): the
variant "gguf" serves the file itself (weights kept quantized, in
--quant-dtype); "fp32" / "bf16" serve a HF copy of it written to --work-dir
with every tensor dequantized by gguf-py (q / k rows un-permuted), i.e. the
same weights, dense.

`--model` is a HF checkpoint dir with one `model.safetensors` (or `--build-llama
DIR` writes a ~125M random Llama there). The quantized copies go to
`--work-dir` (pack-quantized, symmetric, W8A16 per channel, W4A16 group 128; the
writer is tests/quantization/ct_utils.py's, the layout llm-compressor writes).
Each variant is one offline `LLM` (greedy, ignore_eos, in-process engine),
batch 1 and batch 16 of random prompt ids. Decode tokens/s is
batch * (out_len - 1) / (t(out_len) - t(1)): the single-token run is the
prefill, so the difference is the decode steps. Medians of `--repeats`.
The weight bytes are the engine's own count (model_runner.model_memory_usage).

Run with upstream's interpreter (from a directory outside the repo, so that
upstream's subprocesses import upstream's `vllm`) it measures upstream on the same
checkpoints, e.g. `VLLM_ENABLE_V1_MULTIPROCESSING=0 OMP_NUM_THREADS=2
~/.cache/vllm-peer/upstream-venv/bin/python /path/to/this/script ...` (upstream's
weight bytes there are parameters + buffers, short of its oneDNN-packed
unquantized linears; a variant it has no kernel for prints its error).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

# Appended, not prepended: the interpreter's installed `vllm` is the one run, so
# upstream's venv can run this script too (it needs the repo only for the writer).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.append(ROOT)


def build_llama(path: str) -> str:
    """A random Llama of ~125M parameters (12 x 768, GQA 12/4, MLP 2048,
    vocab 32000, untied head), fp32 safetensors."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if os.path.exists(os.path.join(path, "model.safetensors")):
        return path
    cfg = LlamaConfig(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    return path


def write_variants(model: str, work_dir: str) -> dict[str, str]:
    from tests.quantization.ct_utils import write_compressed

    out = {}
    for name, bits, group in (("w8a16", 8, None), ("w4a16-g128", 4, 128)):
        dst = os.path.join(work_dir, name)
        if not os.path.exists(os.path.join(dst, "model.safetensors")):
            write_compressed(model, dst, None, bits, group)
        out[name] = dst
    return out


def dequantized_gguf_copy(gguf_path: str, work_dir: str) -> str:
    """A HF Llama dir holding the .gguf's tensors dequantized (float32)."""
    import torch
    from safetensors.torch import save_file

    from vllm.model_executor.model_loader.gguf_loader import (
        _reverse_llama_qk_permute,
        _tensor_name_map,
    )
    from vllm.transformers_utils.gguf_utils import gguf_hf_config, read_gguf

    dst = os.path.join(work_dir, "gguf-dequantized")
    if os.path.exists(os.path.join(dst, "model.safetensors")):
        return dst
    cfg = gguf_hf_config(gguf_path)
    g = read_gguf(gguf_path)
    if g.architecture != "llama":
        raise SystemExit(f"--gguf: only llama files are supported here, got {g.architecture}")
    name_map = _tensor_name_map("llama", cfg.num_hidden_layers)
    hf_modules = ["model.embed_tokens", "model.norm", "lm_head"]
    for i in range(cfg.num_hidden_layers):
        for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                  "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
                  "post_attention_layernorm"):  # fmt: skip
            hf_modules.append(f"model.layers.{i}.{m}")
    to_hf = {name_map.get_name(m): m for m in hf_modules}
    state = {}
    for info in g.tensors:
        module, _, suffix = info.name.rpartition(".")
        if module not in to_hf:
            continue
        w = torch.from_numpy(g.tensor_data(info))
        if ".attn_q." in info.name:
            w = _reverse_llama_qk_permute(w, cfg.num_attention_heads)
        elif ".attn_k." in info.name:
            w = _reverse_llama_qk_permute(w, cfg.num_key_value_heads)
        state[f"{to_hf[module]}.{suffix}"] = w.contiguous()
    os.makedirs(dst, exist_ok=True)
    cfg.torch_dtype = "float32"
    cfg.save_pretrained(dst)
    save_file(state, os.path.join(dst, "model.safetensors"))
    return dst


def _runner_weight_bytes(worker) -> int:
    runner = worker.model_runner
    n = getattr(runner, "model_memory_usage", 0)
    if n:
        return int(n)
    # Upstream's CPU runner keeps no count: the model's parameters and buffers,
    # which undercounts its unquantized linears (their weights move into
    # oneDNN-packed handles and the parameter is left empty).
    model = runner.get_model()
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def weight_bytes(llm) -> int:
    """The runner's count (ours; upstream's in-process engine: the model's
    parameters and buffers); 0 where neither can be read."""
    try:
        core = llm.llm_engine.engine_core.engine_core
        return int(core.model_executor.collective_rpc(_runner_weight_bytes)[0])
    except Exception:
        return 0


def timed(llm, prompts: list, n: int) -> tuple[float, list]:
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    return time.perf_counter() - t0, outs


def run_variant(path: str, dtype: str, args, vocab: int) -> dict:
    import torch

    from vllm import LLM
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=path,
        dtype=dtype,
        max_model_len=args.input_len + args.output_len + 16,
        seed=0,
        skip_tokenizer_init=True,
        enforce_eager=args.enforce_eager,
        max_num_seqs=max(args.batch_sizes),
    )
    g = torch.Generator().manual_seed(0)
    res = {"weight_bytes": weight_bytes(llm), "decode_tok_s": {}, "first_tokens": None}
    for bs in args.batch_sizes:
        prompts = [
            TokensPrompt(
                prompt_token_ids=torch.randint(10, vocab, (args.input_len,), generator=g).tolist()
            )
            for _ in range(bs)
        ]

        timed(llm, prompts, args.output_len)  # warm-up (first shapes, caches)
        rates = []
        for _ in range(args.repeats):
            t1, _ = timed(llm, prompts, 1)
            tn, outs = timed(llm, prompts, args.output_len)
            assert all(len(o.outputs[0].token_ids) == args.output_len for o in outs)
            rates.append(bs * (args.output_len - 1) / max(tn - t1, 1e-9))
            if bs == 1 and res["first_tokens"] is None:
                res["first_tokens"] = list(outs[0].outputs[0].token_ids[:8])
        res["decode_tok_s"][bs] = {
            "median": statistics.median(rates),
            "all": [round(r, 1) for r in rates],
        }
    del llm
    gc.collect()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", help="HF checkpoint dir (one model.safetensors)")
    ap.add_argument(
        "--build-llama", metavar="DIR", help="write a ~125M random Llama here and use it"
    )
    ap.add_argument("--gguf", help="a .gguf file: variants gguf (kept quantized) vs it dense")
    ap.add_argument("--work-dir", default="/tmp/quantized-decode-bench")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--variants",
        nargs="+",
        default=["fp32", "bf16", "w8a16", "w4a16-g128"],
        help="fp32, bf16 (unquantized), w8a16, w4a16-g128, gguf (served in --quant-dtype)",
    )
    ap.add_argument(
        "--quant-dtype", default="bfloat16", help="activation dtype of the quantized variants"
    )
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    import torch

    if args.gguf:
        model = dequantized_gguf_copy(args.gguf, args.work_dir)
    else:
        model = build_llama(args.build_llama) if args.build_llama else args.model
    if not model:
        ap.error("--model, --build-llama or --gguf")
    if "bf16" in args.variants and not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        print("note: bf16 on a CPU without AVX-512 is emulated", file=sys.stderr)
    with open(os.path.join(model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    quantized = {"gguf": args.gguf} if args.gguf else write_variants(model, args.work_dir)
    plan = {
        "fp32": (model, "float32"),
        "bf16": (model, "bfloat16"),
        **{k: (v, args.quant_dtype) for k, v in quantized.items()},
    }
    results: dict[str, dict] = {}
    failed: dict[str, str] = {}
    for name in args.variants:
        path, dtype = plan[name]
        t0 = time.perf_counter()
        try:
            results[name] = run_variant(path, dtype, args, vocab)
        except Exception as e:  # e.g. a scheme this engine has no kernel for
            print(f"[{name}] failed: {type(e).__name__}: {str(e)[:600]}", flush=True)
            failed[name] = f"{type(e).__name__}: {e}"
            continue
        results[name]["dtype"] = dtype
        print(f"[{name}] done in {time.perf_counter() - t0:.0f}s: {results[name]}", flush=True)

    import vllm

    print(
        f"\nvllm {vllm.__version__} ({os.path.dirname(vllm.__file__)}); model {model}; "
        f"{args.input_len} prompt -> {args.output_len} greedy tokens; "
        f"median of {args.repeats}; torch threads {torch.get_num_threads()}"
    )
    bases = [b for b in ("fp32", "bf16") if b in results]
    head = f"{'variant':<12}{'dtype':<10}{'weight MiB':>11}"
    for bs in args.batch_sizes:
        head += f"{f'bs{bs} tok/s':>13}" + "".join(f"{f'vs {b}':>9}" for b in bases)
    print(head)
    for name, r in results.items():
        line = f"{name:<12}{r['dtype']:<10}{r['weight_bytes'] / 2**20:>11.1f}"
        for bs in args.batch_sizes:
            v = r["decode_tok_s"][bs]["median"]
            line += f"{v:>13.1f}" + "".join(
                f"{v / results[b]['decode_tok_s'][bs]['median']:>8.2f}x" for b in bases
            )
        print(line)
    for name, err in failed.items():
        print(f"{name:<12}failed: {err.splitlines()[0][:200]}")
    for name in results:
        if name not in bases:
            for b in bases:
                if not results[b]["weight_bytes"]:
                    continue
                ratio = results[name]["weight_bytes"] / results[b]["weight_bytes"]
                print(f"weight bytes {name} / {b}: {ratio:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"model": model, "args": vars(args), "results": results, "failed": failed},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
