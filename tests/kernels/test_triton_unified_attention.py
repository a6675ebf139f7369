"""The Triton unified attention kernel under TRITON_INTERPRET=1 (on CPU).

The interpreter must be chosen before triton is imported, so the check runs
in a subprocess; the kernel is compared there with a per-token torch
reference over mixed prefill-chunk + decode batches.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_SCRIPT = r"""
import torch
from vllm.v1.attention.ops.triton_unified_attention import unified_attention

def reference(q, kc, vc, bt, seq_lens, qsl, scale, window, cap):
    bs, hkv, d = kc.shape[1:]
    out = torch.empty_like(q)
    for s in range(len(seq_lens)):
        n, a, b = int(seq_lens[s]), int(qsl[s]), int(qsl[s + 1])
        blocks = bt[s, : (n + bs - 1) // bs].long()
        k = kc[blocks].reshape(-1, hkv, d)[:n].float()
        v = vc[blocks].reshape(-1, hkv, d)[:n].float()
        for t in range(a, b):
            pos = n - (b - t)
            lo = max(0, pos - window + 1) if window else 0
            qq = q[t].float().view(hkv, -1, d)
            sc = torch.einsum("hgd,thd->hgt", qq, k[lo:pos + 1]) * scale
            if cap:
                sc = cap * torch.tanh(sc / cap)
            p = sc.softmax(-1)
            out[t] = torch.einsum("hgt,thd->hgd", p, v[lo:pos + 1]).reshape(-1, d).to(q.dtype)
    return out

torch.manual_seed(0)
for (dtype, d, bs, hkv, g, window, cap) in CASES:
    # (query len, seq len): decodes, a chunk crossing blocks, a fresh prefill
    reqs = [(1, 1), (1, bs + 1), (5, 2 * bs + 3), (bs + 2, bs + 2)]
    max_blocks = max((n + bs - 1) // bs for _, n in reqs)
    nb = len(reqs) * max_blocks + 2
    kc = torch.randn(2, nb, bs, hkv, d, dtype=dtype)
    bt = torch.randperm(nb)[: len(reqs) * max_blocks].view(len(reqs), max_blocks).int()
    qlens = torch.tensor([a for a, _ in reqs])
    qsl = torch.zeros(len(reqs) + 1, dtype=torch.int32)
    qsl[1:] = qlens.cumsum(0)
    seq_lens = torch.tensor([n for _, n in reqs], dtype=torch.int32)
    tok_seq = torch.repeat_interleave(torch.arange(len(reqs), dtype=torch.int32), qlens)
    q = torch.randn(int(qsl[-1]), hkv * g, d, dtype=dtype)
    dev = [x.to(DEVICE) for x in (q, kc, bt, seq_lens, qsl, tok_seq)]
    out = torch.empty_like(dev[0])
    unified_attention(out, dev[0], dev[1][0], dev[1][1], *dev[2:], d ** -0.5, window, cap)
    out = out.cpu()
    ref = reference(q, kc[0], kc[1], bt, seq_lens, qsl, d ** -0.5, window, cap)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
print("OK", len(CASES))
"""

CASES = [
    ("torch.float32", 64, 16, 2, 6, None, None),
    ("torch.bfloat16", 128, 32, 1, 4, None, None),
    ("torch.float32", 64, 16, 4, 1, 7, None),
    ("torch.float32", 80, 16, 2, 2, None, 20.0),
]


def _run(device: str, interpret: bool) -> None:
    cases = (
        "CASES = [" + ", ".join(f"({c[0]}, {', '.join(map(repr, c[1:]))})" for c in CASES) + "]\n"
    )
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    head = f"import torch\nDEVICE = {device!r}\n" + cases
    proc = subprocess.run(
        [sys.executable, "-c", head + _SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"OK {len(CASES)}" in proc.stdout


def test_unified_attention_interpreter():
    """All cases in one interpreter process (importing torch + triton is the slow part)."""
    triton = pytest.importorskip("triton")
    if tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 7):
        # Seen with 3.6 (the H200 image's): its interpreter keeps
        # program_id as a 1-element array, which range() refuses as a loop
        # bound ("only 0-dimensional arrays can be converted"); 3.7 squeezes.
        pytest.skip(f"triton {triton.__version__}'s interpreter cannot take runtime loop bounds")
    _run("cpu", interpret=True)


def test_unified_attention_cuda():
    """The same cases compiled for the GPU (benchmarks/gpu_check.sh)."""
    pytest.importorskip("triton")
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    _run("cuda", interpret=False)
