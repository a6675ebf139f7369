"""Run-time ISA dispatch of the CPU ops (issue 21 item 1).

One build carries the ops once per ISA (vllm._C scalar, vllm._C_avx2,
vllm._C_avx512, vllm._C_avx512_bf16: CMakeLists.txt); vllm/_custom_ops.py
imports the best one the CPU supports, or the one VLLM_CPU_ISA names, and
refuses a name the CPU cannot run. The choice is checked twice: as a
function of written /proc/cpuinfo files (every CPU kind, on any host), and
for real in fresh processes on this host, where the expected variant comes
from the compiler's view of the host (-march=native), not from the code
under test.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vllm import _custom_ops as ops
from vllm.platforms import cpu_capability as cap

from .test_cpu_ops_isa import _NEEDS, _native_macros, best_native_isa

ALL = ("avx512_bf16", "avx512", "avx2", "scalar")
_AVX2 = "fpu sse sse2 avx fma f16c avx2 bmi2"
_AVX512 = f"{_AVX2} avx512f avx512dq avx512bw avx512vl avx512_vnni"
CPUS = {
    "old": "fpu sse sse2 ssse3",  # no AVX2: scalar
    "epyc_zen2": _AVX2,  # AVX2 + FMA + F16C
    "icelake": _AVX512,  # AVX-512 without BF16
    "sapphire": f"{_AVX512} avx512_bf16 amx_tile amx_bf16",
}


@pytest.fixture
def cpu(monkeypatch, tmp_path):
    """Fakes /proc/cpuinfo with the flags of a CPU kind of CPUS."""

    def use(kind: str) -> None:
        path = tmp_path / f"cpuinfo-{kind}"
        path.write_text(f"processor\t: 0\nflags\t\t: {CPUS[kind]}\n")
        monkeypatch.setattr(cap, "_CPUINFO", str(path))

    return use


@pytest.mark.parametrize(
    "kind,built,want",
    [
        ("old", ALL, "scalar"),
        ("epyc_zen2", ALL, "avx2"),
        ("icelake", ALL, "avx512"),
        ("sapphire", ALL, "avx512_bf16"),
        ("sapphire", ("avx2", "scalar"), "avx2"),  # a build without AVX-512
        ("icelake", ("avx512_bf16", "scalar"), "scalar"),  # bf16 build: not here
        ("epyc_zen2", (), None),  # nothing built
    ],
)
def test_auto_picks_best_variant_the_cpu_runs(cpu, kind, built, want):
    cpu(kind)
    assert cap.choose_cpu_ops_isa("auto", built) == want


@pytest.mark.parametrize("kind", list(CPUS))
def test_forced_variant_taken_or_refused(cpu, kind):
    cpu(kind)
    runs = {isa for isa in ALL if not cap.cpu_ops_isa_missing(isa)}
    assert runs == {"old": {"scalar"}, "epyc_zen2": {"scalar", "avx2"}}.get(
        kind, {"scalar", "avx2", "avx512"} | ({"avx512_bf16"} if kind == "sapphire" else set())
    )
    for isa in ALL:
        if isa in runs:
            assert cap.choose_cpu_ops_isa(isa, ALL) == isa
            with pytest.raises(ValueError, match=f"VLLM_CPU_ISA={isa}: this build .* no {isa}"):
                cap.choose_cpu_ops_isa(isa, [b for b in ALL if b != isa])
        else:
            with pytest.raises(ValueError, match=f"VLLM_CPU_ISA={isa}: this CPU lacks avx"):
                cap.choose_cpu_ops_isa(isa, ALL)
    with pytest.raises(ValueError, match="VLLM_CPU_ISA='avx3' is not one of auto, avx512_bf16"):
        cap.choose_cpu_ops_isa("avx3", ALL)


@pytest.mark.parametrize(
    "capability,bf16,want",
    [
        ("DEFAULT", False, "scalar"),
        ("AVX2", False, "avx2"),
        ("AVX512", False, "avx512"),
        ("AVX512", True, "avx512_bf16"),
    ],  # fmt: skip
)
def test_without_cpuinfo_torch_capability_decides(monkeypatch, tmp_path, capability, bf16, want):
    monkeypatch.setattr(cap, "_CPUINFO", str(tmp_path / "absent"))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16)
    assert cap.choose_cpu_ops_isa("auto", ALL) == want


# ------------------------------------------------------- real, this host
_PROBE = """
import torch, torch.nn.functional as F
from vllm import _custom_ops as ops
x, w = torch.randn(3, 100), torch.randn(100)
out = torch.empty_like(x)
ops.rms_norm(out, x, w, 1e-6)  # the compiled op of the variant loaded
torch.testing.assert_close(out, F.rms_norm(x, (100,), w, 1e-6), rtol=2e-5, atol=1e-5)
print("ISA", ops.cpu_ops_isa(), torch.ops._C_cpu.cpu_ops_isa())
"""


def _probe(isa: str | None) -> subprocess.Popen[str]:
    """A fresh process importing the ops with VLLM_CPU_ISA=isa (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_CPU_ISA",)}
    env.pop("VLLM_CPU_DISABLE_CUSTOM_OPS", None)
    if isa is not None:
        env["VLLM_CPU_ISA"] = isa
    cmd = [sys.executable, "-c", _PROBE]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def built_here() -> list[str]:
    """The variants built in this tree; all four are expected on x86."""
    want = ALL if platform.machine() in ("x86_64", "AMD64") else ("scalar",)
    vllm_dir = Path(ops.__file__).parent
    built = [isa for isa in want if list(vllm_dir.glob(f"{ops.cpu_ops_module(isa)[5:]}.*.so"))]
    if built != list(want):
        if os.environ.get("VLLM_ALLOW_NO_CSRC") == "1":
            pytest.skip(f"built: {built} (VLLM_ALLOW_NO_CSRC=1)")
        pytest.fail(f"CPU ops built: {built}, expected {list(want)}: rebuild (pip install -e .)")
    return built


def test_dispatch_on_this_host(built_here):
    """auto: the best variant the compiler says this host runs; every variant
    the host runs can be forced (and computes right); the others are refused
    before any of their code runs."""
    procs = {isa: _probe(isa) for isa in (None, *built_here)}
    try:
        outs = {isa: proc.communicate(timeout=300) for isa, proc in procs.items()}
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
    best = best_native_isa()
    macros = _native_macros()
    for isa, (out, err) in outs.items():
        if isa is None or all(f"__{f}__" in macros for f in _NEEDS.get(isa, ())):
            assert procs[isa].returncode == 0, err[-3000:]
            want = best if isa is None else isa
            assert f"ISA {want} {want}" in out
        else:
            assert procs[isa].returncode != 0
            assert f"ValueError: VLLM_CPU_ISA={isa}: this CPU lacks" in err
