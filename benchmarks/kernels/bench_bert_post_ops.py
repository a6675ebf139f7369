"""Op-level A/B of the fused oneDNN post-ops BERT's CPU layers use (bert.py
`_cpu_packed_weight`) against the separate elementwise pass, BERT-base shapes
(T=4073 rows, 768 <-> 3072), variants interleaved, 25 reps, process CPU ms
(all threads): min and median.

    .venv/bin/python benchmarks/kernels/bench_bert_post_ops.py [bfloat16|float32]
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F


def main(dtype_name: str) -> None:
    dt = getattr(torch, dtype_name)
    rows = 4073
    torch.manual_seed(0)
    h, r = torch.randn(rows, 768, dtype=dt), torch.randn(rows, 768, dtype=dt)
    hi = torch.randn(rows, 3072, dtype=dt)
    p1 = torch.ops.mkldnn._reorder_linear_weight(torch.randn(3072, 768, dtype=dt) * 0.03, 64)
    p2 = torch.ops.mkldnn._reorder_linear_weight(torch.randn(768, 3072, dtype=dt) * 0.03, 64)
    b1, b2 = torch.randn(3072, dtype=dt), torch.randn(768, dtype=dt)
    lin = torch.ops.mkldnn._linear_pointwise
    fns: dict[str, Callable[[], torch.Tensor]] = {
        "fc1+gelu sep": lambda: F.gelu(lin(h, p1, b1, "none", [], "")),
        "fc1 fused gelu": lambda: lin(h, p1, b1, "gelu", [], "none"),
        "fc2+add sep": lambda: lin(hi, p2, b2, "none", [], "") + r,
        "fc2 fused add": lambda: lin.binary(hi, r, p2, b2, "add"),
    }
    times: dict[str, list[float]] = {k: [] for k in fns}
    for f in fns.values():
        f()  # warm-up
    for _ in range(25):
        for name, f in fns.items():
            t0 = time.process_time()
            f()
            times[name].append(time.process_time() - t0)
    for name, ts in times.items():
        lo, med = min(ts) * 1e3, statistics.median(ts) * 1e3
        print(f"{dtype_name} {name:16s} min {lo:7.2f} med {med:7.2f} ms cpu")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
