"""Time the compiled CPU ops against the pure-torch paths they replace, on the
decode shapes of the throughput benchmark (batch 64, hidden 768, 12 heads /
2 kv heads, head 64, intermediate 2048), and decode
attention for 64 x 1k tokens against this machine's copy bandwidth.

    .venv/bin/python benchmarks/kernels/benchmark_cpu_ops.py [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import functools
import time

import torch
import torch.nn.functional as F

from vllm import _custom_ops as ops
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
from vllm.v1.attention.backends import cpu_attn


def bench(fn, iters: int = 200, warmup: int = 20) -> float:
    """Median-free mean seconds per call after warm-up."""
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def copy_bandwidth() -> float:
    """GB/s of a 256 MiB tensor copy (read + write bytes counted)."""
    src = torch.empty(64 * 2**20, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    t = bench(lambda: dst.copy_(src), iters=10, warmup=2)
    return 2 * src.numel() * 4 / t / 1e9


def torch_decode_attention(q, kc, vc, bt, lens, scale):
    """The CPU backend's torch decode path (gather + grouped matmuls)."""
    b, h, d = q.shape
    hkv, bs = kc.shape[2], kc.shape[1]
    md = type("MD", (), {})()
    md.block_size, md.decode_seq_lens_cpu, md.decode_seq_lens = bs, lens.long(), lens.long()
    md.block_table, md.num_decodes = bt.long(), b
    impl = cpu_attn.CPUAttentionBackendImpl(h, d, scale, hkv)
    plan = cpu_attn._make_decode_plan(md, None)
    return lambda: impl._grouped_attention(
        q.reshape(b, hkv, h // hkv, d),
        impl._gather(kc, plan.block_ids, b),
        impl._gather(vc, plan.block_ids, b),
        1,
        bias=plan.key_bias,
    )


def attention_case(batch, seq_len, dtype, hkv=2, h=12, d=64, bs=16):
    nblk = (seq_len + bs - 1) // bs
    kc = torch.randn(batch * nblk, bs, hkv, d, dtype=dtype)
    vc = torch.randn_like(kc)
    bt = torch.randperm(batch * nblk).view(batch, nblk).to(torch.int32)
    q = torch.randn(batch, h, d, dtype=dtype)
    lens = torch.full((batch,), seq_len, dtype=torch.int32)
    return q, kc, vc, bt, lens


def report(name: str, t_torch: float, t_ops: float) -> None:
    print(
        f"{name:34s} torch {t_torch * 1e6:9.1f} us   compiled {t_ops * 1e6:9.1f} us"
        f"   speedup {t_torch / t_ops:5.2f}x"
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--intermediate", type=int, default=2048)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: keep default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    b, hidden = args.batch, 768
    assert ops.cpu_ops_available(), ops.cpu_ops_load_error()
    print(f"threads {torch.get_num_threads()}, dtype {dtype}, batch {b}")

    for seq in (128, 256, 1024):
        q, kc, vc, bt, lens = attention_case(b, seq, dtype)
        out = torch.empty_like(q)
        t_ops = bench(
            functools.partial(ops.paged_attention_decode, out, q, kc, vc, bt, lens, 0.125), 50
        )
        t_torch = bench(torch_decode_attention(q, kc, vc, bt, lens, 0.125), 50)
        report(f"decode attention seq {seq}", t_torch, t_ops)
        if seq == 1024:
            kv_bytes = 2 * kc.numel() * kc.element_size()
            bw = copy_bandwidth()
            floor = kv_bytes / (bw * 1e9)
            gbps = kv_bytes / t_ops / 1e9
            print(
                f"  KV bytes read {kv_bytes / 2**20:.1f} MiB -> {gbps:.1f} GB/s; "
                f"copy bandwidth {bw:.1f} GB/s; floor {floor * 1e6:.0f} us "
                f"-> {t_ops / floor:.2f}x the bandwidth limit"
            )

    x = torch.randn(b, hidden, dtype=dtype)
    res = torch.randn_like(x)
    w = torch.randn(hidden, dtype=dtype)
    out = torch.empty_like(x)
    report(
        "rms_norm",
        bench(lambda: F.rms_norm(x, (hidden,), w, 1e-6)),
        bench(lambda: ops.rms_norm(out, x, w, 1e-6)),
    )
    res_out = torch.empty_like(x)
    report(
        "add + rms_norm",
        bench(lambda: F.rms_norm(x + res, (hidden,), w, 1e-6)),
        bench(lambda: ops.fused_add_rms_norm_out(out, res_out, x, res, w, 1e-6)),
    )

    gu = torch.randn(b, 2 * args.intermediate, dtype=dtype)
    act = torch.empty(b, args.intermediate, dtype=dtype)
    d = args.intermediate
    report(
        "silu_and_mul",
        bench(lambda: F.silu(gu[:, :d]).mul_(gu[:, d:])),
        bench(lambda: ops.silu_and_mul(act, gu)),
    )

    rope = RotaryEmbedding(64, 64, 4096, 10000.0, True, dtype)
    qkv = torch.randn(b, (12 + 4) * 64, dtype=dtype)
    qq, kk = qkv[:, :768], qkv[:, 768:896]
    pos = torch.randint(0, 4096, (b,))
    q_out, k_out = torch.empty_like(qq), torch.empty_like(kk)
    # The torch path gathers cos/sin per position inside the timed call, as the op does.
    report(
        "rotary (neox)",
        bench(
            lambda: rope._rotate(
                qq.view(b, -1, 64), *rope.cos_sin_cache[pos].unsqueeze(1).chunk(2, -1)
            )
        ),
        bench(
            lambda: ops.rotary_embedding_out(
                pos, qq, kk, 64, rope.cos_sin_cache, True, q_out, k_out
            )
        ),
    )

    kvc = torch.zeros(2, 512, 16, 2, 64, dtype=dtype)
    slots = torch.randperm(512 * 16)[:b]
    kv_new = qkv[:, 768:].view(b, 2, 2, 64)
    key, value = kv_new[:, 0], kv_new[:, 1]
    kflat, vflat = kvc[0].view(-1, 2, 64), kvc[1].view(-1, 2, 64)
    report(
        "reshape_and_cache",
        bench(lambda: (kflat.index_copy_(0, slots, key), vflat.index_copy_(0, slots, value))),
        bench(lambda: ops.reshape_and_cache(key, value, kvc[0], kvc[1], slots)),
    )


if __name__ == "__main__":
    main()
