"""Per-op times of the CPU ops (csrc/cpu) built for each ISA on one machine.

Compiles csrc/cpu/*.cpp once per ISA (AVX-512 (+BF16), AVX2 + FMA + F16C, scalar:
only the flags differ, as tests/kernels/test_cpu_ops_isa.py does) into a
temporary directory, loads the builds side by side under their own op
namespaces and times each op at the decode shapes of a 135M Llama
(SmolLM2-135M: hidden 576, 9 query / 3 kv heads of 64, intermediate 1536,
vocabulary 49152): medians of interleaved repeats, so a load change on a
shared machine hits every build alike. The in-tree vllm._C is not touched.

    python benchmarks/kernels/benchmark_cpu_ops_isa.py --batch 1 --threads 1
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from vllm.platforms.cpu_capability import cpu_ops_isa_missing

CSRC = Path(__file__).resolve().parents[2] / "csrc" / "cpu"
# The ISA variants CMakeLists.txt builds (vllm._C_<isa>; scalar: vllm._C).
FLAGS = {
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma", "-mf16c"],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "scalar": [],
}
FLAGS["avx512_bf16"] = [*FLAGS["avx512"], "-mavx512bf16"]
HIDDEN, HEADS, KV_HEADS, HEAD, INTER, VOCAB = 576, 9, 3, 64, 1536, 49152


def build(isas: list[str], out: Path) -> dict[str, str]:
    """One shared library per ISA (in parallel); returns isa -> namespace."""
    from torch.utils import cpp_extension

    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        sys.exit("no C++ compiler")
    unity = out / "unity.cpp"
    unity.write_text("".join(f'#include "{p}"\n' for p in sorted(CSRC.glob("*.cpp"))))
    inc = [f"-I{p}" for p in cpp_extension.include_paths()]
    inc.append(f"-I{cpp_extension.sysconfig.get_paths()['include']}")
    libs = [f"-L{p}" for p in cpp_extension.library_paths()] + ["-ltorch", "-ltorch_cpu", "-lc10"]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    procs = {}
    for isa in isas:
        lib = out / f"bench_{isa}.so"
        # -O3 as CMakeLists.txt builds vllm._C.
        cmd = [cxx, "-O3", "-std=c++17", "-shared", "-fPIC", "-fopenmp", "-w",
               "-fvisibility=hidden", "-fvisibility-inlines-hidden", *FLAGS[isa],
               f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-DVLLM_CPU_OPS_NAMESPACE=_bench_{isa}",
               *inc, str(unity), "-o", str(lib), *libs]  # fmt: skip
        procs[isa] = (lib, subprocess.Popen(cmd))
    for isa, (lib, proc) in procs.items():
        if proc.wait() != 0:
            sys.exit(f"{isa} build failed")
        torch.ops.load_library(str(lib))
    return {isa: f"_bench_{isa}" for isa in isas}


def cases(batch: int, ctx: int, dtype: torch.dtype) -> dict[str, Callable[[object], None]]:
    """op name -> fn(namespace) running that op once at the decode shapes."""
    g = torch.Generator().manual_seed(0)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    x, res, w = rnd(batch, HIDDEN), rnd(batch, HIDDEN), rnd(HIDDEN)
    out = torch.empty_like(x)
    gate_up, act = rnd(batch, 2 * INTER), torch.empty(batch, INTER, dtype=dtype)
    qkv = rnd(batch, (HEADS + 2 * KV_HEADS) * HEAD)
    q, k = qkv[:, : HEADS * HEAD], qkv[:, HEADS * HEAD : (HEADS + KV_HEADS) * HEAD]
    cos_sin, pos = rnd(4096, HEAD), torch.full((batch,), ctx - 1, dtype=torch.int64)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    bs = 16
    blocks = (ctx + bs - 1) // bs
    kc, vc = (
        rnd(batch * blocks + 1, bs, KV_HEADS, HEAD),
        rnd(batch * blocks + 1, bs, KV_HEADS, HEAD),
    )
    table = torch.randperm(batch * blocks, generator=g)[: batch * blocks].view(batch, blocks)
    table = table.to(torch.int32)
    lens = torch.full((batch,), ctx, dtype=torch.int32)
    query, attn_out = rnd(batch, HEADS, HEAD), torch.empty(batch, HEADS, HEAD, dtype=dtype)
    kv_new = rnd(2, batch, KV_HEADS, HEAD)
    slots = torch.arange(batch, dtype=torch.int64) * bs * blocks // max(batch, 1)
    logits = rnd(batch, VOCAB)
    words = torch.randint(-(2**31), 2**31 - 1, (batch, VOCAB // 32), dtype=torch.int32, generator=g)
    rows = torch.arange(batch)
    return {
        "rms_norm": lambda ns: ns.rms_norm(out, x, w, 1e-6),
        "add+rms_norm": lambda ns: ns.fused_add_rms_norm_out(out, res, x, res, w, 1e-6),
        "silu_and_mul": lambda ns: ns.silu_and_mul(act, gate_up),
        "rotary (neox)": lambda ns: ns.rotary_embedding_out(
            pos, q, k, HEAD, cos_sin, True, q_out, k_out
        ),
        "rotary (gpt-j)": lambda ns: ns.rotary_embedding_out(
            pos, q, k, HEAD, cos_sin, False, q_out, k_out
        ),
        f"attention ctx {ctx}": lambda ns: ns.paged_attention_decode(
            attn_out, query, kc, vc, table, lens, HEAD**-0.5, 0, 0.0
        ),
        "reshape_and_cache": lambda ns: ns.reshape_and_cache(kv_new[0], kv_new[1], kc, vc, slots),
        "grammar mask": lambda ns: ns.apply_token_bitmask(logits, words, rows),
    }


def time_us(op: Callable[[object], None], ns: object, iters: int) -> float:
    """Mean us of op(ns) over iters calls."""
    t0 = time.perf_counter()
    for _ in range(iters):
        op(ns)
    return (time.perf_counter() - t0) / iters * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=512, help="context length of each sequence")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=15, help="interleaved rounds (median)")
    ap.add_argument(
        "--isa", default=None, help=f"of {', '.join(FLAGS)}; default: those this CPU runs"
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        isas = args.isa.split(",") if args.isa else [i for i in FLAGS if not cpu_ops_isa_missing(i)]
        spaces = build(isas, Path(tmp))
        ops = cases(args.batch, args.ctx, getattr(torch, args.dtype))
        print(f"batch {args.batch}, {args.dtype}, {args.threads} thread(s); median us of "
              f"{args.repeats} rounds")  # fmt: skip
        print(f"{'op':<22}" + "".join(f"{isa:>10}" for isa in spaces))
        for name, op in ops.items():
            samples: dict[str, list[float]] = {isa: [] for isa in spaces}
            for isa, ns in spaces.items():  # warm-up
                time_us(op, getattr(torch.ops, ns), 5)
            for _ in range(args.repeats):
                for isa, ns in spaces.items():
                    samples[isa].append(time_us(op, getattr(torch.ops, ns), 20))
            cells = "".join(f"{statistics.median(v):>10.1f}" for v in samples.values())
            print(f"{name:<22}{cells}")


if __name__ == "__main__":
    main()
