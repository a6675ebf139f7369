"""Weight-only quantized GEMMs (int8 per-group, FP8 e4m3) against float64.

`ops.int8_group_gemm` / `ops.fp8_weight_gemm` run the compiled op
(csrc/cpu/quant_gemm.cpp, torch.ops._C_cpu) when vllm._C has it and the
pure-PyTorch block-dequantize path otherwise; both paths are checked here
against x.double() @ W.double().T with W dequantized in float64.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vllm import _custom_ops as ops

OPS = ("int8_group_gemm", "fp8_weight_gemm")


# Set by test_isa_variants for the pytest it runs on a build of
# csrc/cpu/quant_gemm.cpp with other ISA flags: "<library>:<namespace>".
_VARIANT = os.environ.get("VLLM_QUANT_GEMM_VARIANT")


class _Impl:
    """The two GEMMs as one path computes them."""

    def __init__(self, ns: str | None = None):
        self.ns = ns

    def int8(self, x, w, scales, g, offsets=None):
        if self.ns is None:
            return ops.int8_group_gemm(x, w, scales, g, offsets)
        op = getattr(torch.ops, self.ns).int8_group_gemm
        return op(x.reshape(-1, x.shape[-1]), w, scales, g, offsets).reshape(
            *x.shape[:-1], w.shape[0]
        )

    def fp8(self, x, w, scales, g):
        if self.ns is None:
            return ops.fp8_weight_gemm(x, w, scales, g)
        op = getattr(torch.ops, self.ns).fp8_weight_gemm
        return op(x.reshape(-1, x.shape[-1]), w, scales, g).reshape(*x.shape[:-1], w.shape[0])


@pytest.fixture(params=["variant"] if _VARIANT else ["compiled", "torch"])
def impl(request, monkeypatch):
    """Every test runs on both paths of the wrappers (or, in a variant run,
    on the variant build's ops)."""
    torch.manual_seed(0)
    if request.param == "variant":
        lib, ns = _VARIANT.split(":")
        torch.ops.load_library(lib)
        return _Impl(ns)
    if request.param == "torch":
        monkeypatch.setattr(ops, "_LOAD_ERROR", "testing the fallback")
        return _Impl()
    if not all(ops._has_cpu_op(op) for op in OPS):
        if os.environ.get("VLLM_ALLOW_NO_CSRC") == "1":
            pytest.skip("vllm._C without the quantized GEMM ops (VLLM_ALLOW_NO_CSRC=1)")
        pytest.fail(
            f"vllm._C lacks {OPS} ({ops.cpu_ops_load_error()}); rebuild with "
            "`python setup.py build_ext --inplace`"
        )
    return _Impl()


def _reference(x, w, scales, group_size, offsets=None):
    wd = w.float().double().unflatten(1, (-1, group_size)) * scales.double().unsqueeze(-1)
    if offsets is not None:
        wd = wd + offsets.double().unsqueeze(-1)
    wd = wd.flatten(1)
    return x.double() @ wd.t(), x.double().abs() @ wd.abs().t()


# Above this many rows, bf16 / fp16 x multiplies W dequantized to x's dtype
# (torch's GEMM in that dtype, as upstream does for large batches).
_ROUNDED_W_ROWS = 8


def _check(out, x, ref, mag):
    """fp32 accumulation over K terms, then one rounding to x.dtype; for more
    than _ROUNDED_W_ROWS rows of bf16 / fp16 x, W itself rounded to x.dtype."""
    assert out.dtype == x.dtype and out.shape == ref.shape
    k = x.shape[-1]
    rel_out = {torch.float32: 0.0, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[x.dtype]
    tol = rel_out * ref.abs() + 2 * k * 2.0**-24 * mag + 1e-30
    if x.dtype != torch.float32 and x.reshape(-1, k).shape[0] > _ROUNDED_W_ROWS:
        # per weight 2^-9 (bf16) / 2^-12 (fp16) relative, doubled for the
        # fp32 -> x.dtype double rounding; fp16 subnormals: 2^-25 absolute.
        tol = tol + 2 * rel_out * mag + 2.0**-25 * x.double().abs().sum(-1, keepdim=True)
    err = (out.double() - ref).abs()
    assert bool((err <= tol).all()), f"max err {err.max().item():.3g} (tol {tol.max().item():.3g})"


def _groups(k):
    return [g for g in (16, 32, 128) if k % g == 0 and g < k] + [k]


SHAPES = [(48, 128), (300, 256), (17, 76)]  # (N, K); 300 > one 256-row block, 76 % 8 != 0


@pytest.mark.parametrize("m", [1, 7, 16, 70])  # tiles 8 | 4 + 2 + 1 | 2 x 8 | sgemm
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_offsets", [False, True])
def test_int8_group_gemm(impl, m, n, k, dtype, with_offsets):
    x = torch.randn(m, k).to(dtype)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8)
    for g in _groups(k):
        scales = torch.rand(n, k // g) * 0.02 + 1e-3
        offsets = torch.randn(n, k // g) * 0.1 if with_offsets else None
        out = impl.int8(x, w, scales, g, offsets)
        _check(out, x, *_reference(x, w, scales, g, offsets))


def _all_e4m3(n, k):
    """Random bytes covering every finite e4m3 encoding: subnormals (exponent
    field 0), +-0, the max 448; NaN (0x7f / 0xff) replaced by 0."""
    b = torch.randint(0, 256, (n, k), dtype=torch.uint8)
    b[(b & 0x7F) == 0x7F] = 0
    b.view(-1)[:256] = torch.arange(256, dtype=torch.uint8)[: min(256, n * k)]
    b[(b & 0x7F) == 0x7F] = 0x7E
    return b.view(torch.float8_e4m3fn)


@pytest.mark.parametrize("m", [1, 5, 16, 70])
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_weight_gemm(impl, m, n, k, dtype):
    x = torch.randn(m, k).to(dtype)
    w = _all_e4m3(n, k)
    for g in _groups(k):
        scales = torch.rand(n, k // g) * 0.02 + 1e-3
        out = impl.fp8(x, w, scales, g)
        _check(out, x, *_reference(x, w, scales, g))


def test_subnormal_e4m3_only(impl):
    """Only subnormal / zero weights: a decode that flushes them gives 0."""
    w = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 0x81] * 4] * 3, dtype=torch.uint8)
    w = w.view(torch.float8_e4m3fn)
    x = torch.ones(1, 32)
    out = impl.fp8(x, w, torch.ones(3, 1), 32)
    # 2^-9 * (1 + ... + 7 - 1) * 4 repeats
    assert torch.allclose(out, torch.full((1, 3), 27 * 4 * 2.0**-9))


def test_fp16_and_leading_dims(impl):
    x = torch.randn(2, 3, 64, dtype=torch.float16)
    w = torch.randint(-128, 128, (40, 64), dtype=torch.int8)
    scales = torch.rand(40, 2) * 0.01
    out = impl.int8(x, w, scales, 32)
    assert out.shape == (2, 3, 40)
    ref, mag = _reference(x.reshape(6, 64), w, scales, 32)
    _check(out.reshape(6, 40), x.reshape(6, 64), ref, mag)


def test_fp16_many_rows(impl):
    """fp16 x above _ROUNDED_W_ROWS rows: W rounded to fp16, fp16 GEMM."""
    x = torch.randn(20, 128, dtype=torch.float16)
    w = _all_e4m3(72, 128)
    scales = torch.rand(72, 1) * 0.01
    _check(impl.fp8(x, w, scales, 128), x, *_reference(x, w, scales, 128))
    w8 = torch.randint(-128, 128, (72, 128), dtype=torch.int8)
    s8, o8 = torch.rand(72, 4) * 0.01, torch.randn(72, 4) * 0.1
    _check(impl.int8(x, w8, s8, 32, o8), x, *_reference(x, w8, s8, 32, o8))


def test_many_row_blocks(impl):
    """K = 16384: the compiled op's many-rows path dequantizes 128 rows at a
    time, so N = 300 takes three blocks (written as column blocks of out)."""
    x = torch.randn(12, 16384).to(torch.bfloat16)
    w = torch.randint(-128, 128, (300, 16384), dtype=torch.int8)
    scales, offsets = torch.rand(300, 512) * 0.01, torch.randn(300, 512) * 0.01
    _check(impl.int8(x, w, scales, 32, offsets), x, *_reference(x, w, scales, 32, offsets))
    wf = _all_e4m3(300, 16384)
    s128 = torch.rand(300, 128) * 0.01
    _check(impl.fp8(x, wf, s128, 128), x, *_reference(x, wf, s128, 128))


def test_non_contiguous_x(impl):
    x = torch.randn(64, 8)[:, :4].t()  # [4, 64], strided rows
    w = torch.randint(-128, 128, (24, 64), dtype=torch.int8)
    scales = torch.rand(24, 4)
    _check(impl.int8(x, w, scales, 16), x, *_reference(x, w, scales, 16))


@pytest.mark.skipif(_VARIANT is not None, reason="the wrappers' checks")
def test_bad_shapes():
    x = torch.randn(2, 96)
    w = torch.zeros(8, 96, dtype=torch.int8)
    with pytest.raises(ValueError, match=r"group_size 64 does not divide K = 96.*\(8, 96\)"):
        ops.int8_group_gemm(x, w, torch.ones(8, 1), 64)
    with pytest.raises(ValueError, match=r"scales must be float32 \(8, 3\)"):
        ops.int8_group_gemm(x, w, torch.ones(8, 2), 32)
    with pytest.raises(ValueError, match=r"offsets must be float32 \(8, 3\)"):
        ops.int8_group_gemm(x, w, torch.ones(8, 3), 32, torch.ones(8, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"x \(2, 95\) does not match weight \(8, 96\)"):
        ops.int8_group_gemm(x[:, :95], w, torch.ones(8, 3), 32)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        ops.fp8_weight_gemm(x, w, torch.ones(8, 3), 32)
    with pytest.raises(ValueError, match="torch.int8"):
        ops.int8_group_gemm(x, w.view(torch.uint8), torch.ones(8, 3), 32)


# ----------------------------------------------- the other ISA paths, here
# The installed library has the best path the build host offers (AVX-512
# here); the AVX2 + FMA + F16C and scalar paths are compiled from the same
# source with those flags only, and this file's tests are rerun against each
# in a subprocess (VLLM_QUANT_GEMM_VARIANT).
_SOURCE = Path(__file__).resolve().parents[2] / "csrc" / "cpu" / "quant_gemm.cpp"
_VARIANT_FLAGS = {"avx2": ["-mavx2", "-mfma", "-mf16c"], "scalar": []}


def _compiler() -> str | None:
    return shutil.which("c++") or shutil.which("g++")


def _native_macros() -> str:
    cxx = _compiler()
    if cxx is None:
        return ""
    cmd = [cxx, "-march=native", "-dM", "-E", "-x", "c++", "/dev/null"]
    return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout


@pytest.fixture(scope="module")
def variant_libs(tmp_path_factory) -> dict[str, Path]:
    """quant_gemm.cpp alone, once per ISA variant, compiled in parallel."""
    from torch.utils import cpp_extension

    cxx = _compiler()
    if cxx is None:
        if os.environ.get("VLLM_ALLOW_NO_CSRC") == "1":
            pytest.skip("no C++ compiler (VLLM_ALLOW_NO_CSRC=1)")
        pytest.fail("no C++ compiler to build the ISA variants of quant_gemm.cpp")
    out = tmp_path_factory.mktemp("quant_gemm")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    inc = [f"-I{p}" for p in cpp_extension.include_paths()]
    libs = [f"-L{p}" for p in cpp_extension.library_paths()] + ["-ltorch", "-ltorch_cpu", "-lc10"]
    procs = {}
    for isa, flags in _VARIANT_FLAGS.items():
        lib = out / f"qg_{isa}.so"
        cmd = [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-fopenmp", *flags,
               f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-DVLLM_QUANT_GEMM_STANDALONE=_qg_{isa}",
               *inc, str(_SOURCE), "-o", str(lib), *libs]  # fmt: skip
        procs[isa] = (lib, subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True))
    for isa, (_, proc) in procs.items():
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{isa} build failed:\n{err[-3000:]}"
    return {isa: lib for isa, (lib, _) in procs.items()}


def _runnable(isa: str) -> bool:
    return isa != "avx2" or all(f"__{f}__" in _native_macros() for f in ("AVX2", "FMA", "F16C"))


@pytest.fixture(scope="module")
def variant_runs(variant_libs) -> dict[str, subprocess.Popen]:
    """This file's tests against each variant build, all runs at once."""
    runs = {}
    for isa, lib in variant_libs.items():
        if _runnable(isa):
            env = dict(os.environ, VLLM_QUANT_GEMM_VARIANT=f"{lib}:_qg_{isa}")
            cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__]
            runs[isa] = subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
    return runs


@pytest.mark.skipif(_VARIANT is not None, reason="runs the variants")
@pytest.mark.parametrize("isa", list(_VARIANT_FLAGS))
def test_isa_variants(variant_runs, isa):
    if isa not in variant_runs:
        pytest.skip("host lacks AVX2 / FMA / F16C")
    out, _ = variant_runs[isa].communicate(timeout=600)
    assert variant_runs[isa].returncode == 0, out[-6000:]
    # Only the runner tests (this one per variant, test_bad_shapes) skip there.
    skipped = f"{len(_VARIANT_FLAGS) + 1} skipped"
    assert " passed" in out and skipped in out, out[-2000:]


def test_isa_of_build(impl):
    """Each build runs the path its flags allow (not a silent scalar one)."""
    if impl.ns is not None:
        assert getattr(torch.ops, impl.ns).quant_gemm_isa() == impl.ns.removeprefix("_qg_")
    elif ops._has_cpu_op("quant_gemm_isa") and ops._LOAD_ERROR is None:
        macros = _native_macros()
        want = "avx512" if "__AVX512F__" in macros and "__AVX512BW__" in macros else None
        if want is None and all(f"__{f}__" in macros for f in ("AVX2", "FMA", "F16C")):
            want = "avx2"
        assert torch.ops._C_cpu.quant_gemm_isa() == (want or "scalar")
