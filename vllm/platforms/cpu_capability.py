"""What this CPU computes natively, read at one place (issue 21).

A leaf module (it imports only torch) so that vllm.config can ask without
importing the CPU platform, whose backend choice reaches into vllm.v1."""

from __future__ import annotations

import functools
from collections.abc import Collection

import torch

# /proc/cpuinfo flags of a CPU that multiplies bf16 in hardware: x86's
# AVX512_BF16 (VDPBF16PS) and AMX-BF16 tiles, aarch64's "bf16" (BFDOT/BFMMLA).
# Without one of them every bf16 GEMM converts through fp32 in software: on a
# 2-core AVX2 EPYC the 64 x 128 -> 128 peer workload took > 3 min in bf16
# against ~30 s in fp32 (issue 21).
_NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
_CPUINFO = "/proc/cpuinfo"


def _cpuinfo_flags() -> frozenset[str] | None:
    """The first "flags" (x86) or "Features" (aarch64) line of /proc/cpuinfo
    (the features the kernel enabled), or None where there is none."""
    try:
        with open(_CPUINFO, encoding="utf-8", errors="replace") as f:
            lines = [ln for ln in f if ln.startswith(("flags", "Features"))]
    except OSError:
        return None
    return frozenset(lines[0].partition(":")[2].split()) if lines else None


def _torch_probe(name: str) -> bool:
    return bool(getattr(torch.cpu, name, lambda: False)())


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes in bf16 natively. The ONE place the capability
    is read (ModelConfig's dtype="auto" rule asks here; tests fake it here).
    Linux: /proc/cpuinfo's flags; elsewhere torch's own ISA probes."""
    flags = _cpuinfo_flags()
    if flags is not None:
        return bool(flags & _NATIVE_BF16_FLAGS)
    return any(_torch_probe(p) for p in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


# The ISA variants of the CPU ops library (CMakeLists.txt builds one module
# each), best first, with the /proc/cpuinfo flags each one's code uses.
_AVX2 = ("avx2", "fma", "f16c")
_AVX512 = (*_AVX2, "avx512f", "avx512bw", "avx512vl", "avx512dq")
CPU_OPS_ISA_FLAGS: dict[str, tuple[str, ...]] = {
    "avx512_bf16": (*_AVX512, "avx512_bf16"),
    "avx512": _AVX512,
    "avx2": _AVX2,
    "scalar": (),
}


def cpu_ops_isa_missing(isa: str) -> list[str]:
    """The CPU features ISA variant `isa` needs that this CPU lacks (empty:
    it runs here). Linux: /proc/cpuinfo; elsewhere torch's capability
    (AVX512 implies f/bw/vl/dq, AVX2 implies fma; F16C comes with both)."""
    need = CPU_OPS_ISA_FLAGS[isa]
    flags = _cpuinfo_flags()
    if flags is None:
        cap = torch.backends.cpu.get_cpu_capability()
        have = set(_AVX2) if cap in ("AVX2", "AVX512") else set()
        if cap == "AVX512":
            have.update(_AVX512)
            if _torch_probe("_is_avx512_bf16_supported"):
                have.add("avx512_bf16")
        flags = frozenset(have)
    return [f for f in need if f not in flags]


def choose_cpu_ops_isa(requested: str, built: Collection[str]) -> str | None:
    """The ISA variant of the CPU ops to load, of those `built`. `requested`
    (VLLM_CPU_ISA) other than "auto" is taken as is, or refused with a
    ValueError naming VLLM_CPU_ISA: an unknown name, a feature this CPU lacks
    (its code would die on an illegal instruction), or a variant this build
    has not. "auto": the best built variant this CPU runs; None when none."""
    names = ", ".join(CPU_OPS_ISA_FLAGS)
    if requested == "auto":
        runnable = (isa for isa in CPU_OPS_ISA_FLAGS if isa in built)
        return next((isa for isa in runnable if not cpu_ops_isa_missing(isa)), None)
    if requested not in CPU_OPS_ISA_FLAGS:
        raise ValueError(f"VLLM_CPU_ISA={requested!r} is not one of auto, {names}")
    missing = cpu_ops_isa_missing(requested)
    if missing:
        raise ValueError(
            f"VLLM_CPU_ISA={requested}: this CPU lacks {', '.join(missing)}; "
            f"unset it (auto) or choose a variant it runs"
        )
    if requested not in built:
        have = ", ".join(isa for isa in CPU_OPS_ISA_FLAGS if isa in built) or "none"
        raise ValueError(
            f"VLLM_CPU_ISA={requested}: this build of the CPU ops has no {requested} "
            f"variant (built: {have}); rebuild with a compiler that takes its flags"
        )
    return requested
