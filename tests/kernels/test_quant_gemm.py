"""Weight-only quantized GEMMs (int8 per-group, FP8 e4m3) against float64.

`ops.int8_group_gemm` / `ops.fp8_weight_gemm` run the compiled op
(csrc/cpu/quant_gemm.cpp, torch.ops._C_cpu) when vllm._C has it and the
pure-PyTorch block-dequantize path otherwise; both paths are checked here
against x.double() @ W.double().T with W dequantized in float64.
"""

from __future__ import annotations

import pytest
import torch

from vllm import _custom_ops as ops

OPS = ("int8_group_gemm", "fp8_weight_gemm")


@pytest.fixture(params=["compiled", "torch"])
def path(request, monkeypatch):
    """Every test runs on both paths of the wrappers."""
    torch.manual_seed(0)
    if request.param == "torch":
        monkeypatch.setattr(ops, "_LOAD_ERROR", "testing the fallback")
    elif not all(ops._has_cpu_op(op) for op in OPS):
        if True:  # the C++ ops follow in the next commit
            pytest.skip("vllm._C without the quantized GEMM ops (VLLM_ALLOW_NO_CSRC=1)")
        pytest.fail(
            f"vllm._C lacks {OPS} ({ops.cpu_ops_load_error()}); rebuild with "
            "`python setup.py build_ext --inplace`"
        )
    return request.param


def _reference(x, w, scales, group_size, offsets=None):
    wd = w.float().double().unflatten(1, (-1, group_size)) * scales.double().unsqueeze(-1)
    if offsets is not None:
        wd = wd + offsets.double().unsqueeze(-1)
    wd = wd.flatten(1)
    return x.double() @ wd.t(), x.double().abs() @ wd.abs().t()


def _check(out, x, ref, mag):
    """fp32 accumulation over K terms, then one rounding to x.dtype."""
    assert out.dtype == x.dtype and out.shape == ref.shape
    k = x.shape[-1]
    rel_out = {torch.float32: 0.0, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[x.dtype]
    tol = rel_out * ref.abs() + 2 * k * 2.0**-24 * mag + 1e-30
    err = (out.double() - ref).abs()
    assert bool((err <= tol).all()), f"max err {err.max().item():.3g} (tol {tol.max().item():.3g})"


def _groups(k):
    return [g for g in (16, 32, 128) if k % g == 0 and g < k] + [k]


SHAPES = [(48, 128), (300, 256), (17, 72)]  # (N, K); 300 > one 256-row block, 72 % 16 != 0


@pytest.mark.parametrize("m", [1, 3, 16, 70])
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_offsets", [False, True])
def test_int8_group_gemm(path, m, n, k, dtype, with_offsets):
    x = torch.randn(m, k).to(dtype)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8)
    for g in _groups(k):
        scales = torch.rand(n, k // g) * 0.02 + 1e-3
        offsets = torch.randn(n, k // g) * 0.1 if with_offsets else None
        out = ops.int8_group_gemm(x, w, scales, g, offsets)
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
def test_fp8_weight_gemm(path, m, n, k, dtype):
    x = torch.randn(m, k).to(dtype)
    w = _all_e4m3(n, k)
    for g in _groups(k):
        scales = torch.rand(n, k // g) * 0.02 + 1e-3
        out = ops.fp8_weight_gemm(x, w, scales, g)
        _check(out, x, *_reference(x, w, scales, g))


def test_subnormal_e4m3_only(path):
    """Only subnormal / zero weights: a decode that flushes them gives 0."""
    w = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 0x81] * 4] * 3, dtype=torch.uint8)
    w = w.view(torch.float8_e4m3fn)
    x = torch.ones(1, 32)
    out = ops.fp8_weight_gemm(x, w, torch.ones(3, 1), 32)
    # 2^-9 * (1 + ... + 7 - 1) * 4 repeats
    assert torch.allclose(out, torch.full((1, 3), 27 * 4 * 2.0**-9))


def test_fp16_and_leading_dims(path):
    x = torch.randn(2, 3, 64, dtype=torch.float16)
    w = torch.randint(-128, 128, (40, 64), dtype=torch.int8)
    scales = torch.rand(40, 2) * 0.01
    out = ops.int8_group_gemm(x, w, scales, 32)
    assert out.shape == (2, 3, 40)
    ref, mag = _reference(x.reshape(6, 64), w, scales, 32)
    _check(out.reshape(6, 40), x.reshape(6, 64), ref, mag)


def test_non_contiguous_x(path):
    x = torch.randn(64, 8)[:, :4].t()  # [4, 64], strided rows
    w = torch.randint(-128, 128, (24, 64), dtype=torch.int8)
    scales = torch.rand(24, 4)
    _check(ops.int8_group_gemm(x, w, scales, 16), x, *_reference(x, w, scales, 16))


def test_bad_shapes(path):
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
