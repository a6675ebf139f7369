"""What this CPU computes natively, read at one place (issue 21).

A leaf module (it imports only torch) so that vllm.config can ask without
importing the CPU platform, whose backend choice reaches into vllm.v1."""

from __future__ import annotations

import functools

import torch

# /proc/cpuinfo flags of a CPU that multiplies bf16 in hardware: x86's
# AVX512_BF16 (VDPBF16PS) and AMX-BF16 tiles, aarch64's "bf16" (BFDOT/BFMMLA).
# Without one of them every bf16 GEMM converts through fp32 in software: on a
# 2-core AVX2 EPYC the 64 x 128 -> 128 peer workload took > 3 min in bf16
# against ~30 s in fp32 (issue 21).
_NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
_CPUINFO = "/proc/cpuinfo"


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes in bf16 natively. The ONE place the capability
    is read (ModelConfig's dtype="auto" rule asks here; tests fake it here).
    Linux: the first "flags" (x86) or "Features" (aarch64) line of
    /proc/cpuinfo; elsewhere torch's own ISA probes."""
    try:
        with open(_CPUINFO, encoding="utf-8", errors="replace") as f:
            lines = [ln for ln in f if ln.startswith(("flags", "Features"))]
    except OSError:
        lines = []
    if lines:
        flags = set(lines[0].partition(":")[2].split())
        return bool(flags & _NATIVE_BF16_FLAGS)
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)
