"""Every vector path of the CPU ops (csrc/cpu) against torch references.

The installed ops are the ISA variant vllm/_custom_ops.py chose for this host
(vllm._C_avx512_bf16 / _avx512 / _avx2 or the scalar vllm._C: one per
process). The AVX2 + FMA (+ F16C) and the scalar paths are also compiled
here from the current sources, as one translation unit per ISA (`unity`
below: torch's headers parsed once), into a temporary directory, each
registering its ops under a namespace of its own (_cx_avx2, _cx_scalar) so
they load beside the installed ones; the in-tree libraries are never
rebuilt. Each test then runs against every build the host can execute,
plus the installed ops ("native") when they are current. A build is kept
under ~/.cache/vllm-tests/cpu-ops-isa (XDG_CACHE_HOME), keyed by its inputs
(every csrc/cpu file, the command, the compiler's version, the torch build,
this file): only unchanged sources reuse it, so any edit, a fresh machine or
VLLM_TEST_NO_COMPILE_CACHE=1 builds again (~30 s on 2 cores).

Checks are tight enough that a wrong vector path fails: fp32 results
within a few fp32 ulps of an fp32 / float64 reference; bf16 / fp16 results
within one ulp of the same computation rounded where the op rounds, and
equal to it on all but a small fraction of elements (truncating instead of
rounding to nearest even moves about half of them). Sizes leave tails:
head sizes, hidden sizes and rotary halves that are not multiples of the
8 / 16 lanes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from vllm import _custom_ops as ops

_CSRC = Path(__file__).resolve().parents[2] / "csrc" / "cpu"
_VARIANT_FLAGS = {
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "scalar": [],
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma", "-mf16c"],
}
_VARIANT_FLAGS["avx512_bf16"] = [*_VARIANT_FLAGS["avx512"], "-mavx512bf16"]
# The CPU features each build runs on (the compiler's -march=native macros).
_NEEDS = {
    "avx2": ("AVX2", "FMA", "F16C"),
    "avx512": ("AVX2", "FMA", "F16C", "AVX512F", "AVX512BW", "AVX512VL", "AVX512DQ"),
}
_NEEDS["avx512_bf16"] = (*_NEEDS["avx512"], "AVX512BF16")
# Built by default: the AVX2 and scalar paths (the installed build on an
# AVX-512 host loads another). VLLM_CPU_OPS_ISA_VARIANTS=avx2,scalar,avx512
# (,avx512_bf16) adds AVX-512 builds of the current sources.
_VARIANTS = os.environ.get("VLLM_CPU_OPS_ISA_VARIANTS", "avx2,scalar").split(",")


def _compiler() -> str | None:
    return shutil.which("c++") or shutil.which("g++")


def _native_macros() -> str:
    cxx = _compiler()
    if cxx is None:
        return ""
    cmd = [cxx, "-march=native", "-dM", "-E", "-x", "c++", "/dev/null"]
    return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout


def _build_cmd(cxx: str, src: Path, lib: Path, isa: str) -> list[str]:
    from torch.utils import cpp_extension

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    inc = [f"-I{p}" for p in cpp_extension.include_paths()]
    inc.append(f"-I{cpp_extension.sysconfig.get_paths()['include']}")
    libs = [f"-L{p}" for p in cpp_extension.library_paths()] + ["-ltorch", "-ltorch_cpu", "-lc10"]
    # Hidden symbols: the builds' inline helpers (compiled for different
    # ISAs) must not be merged with vllm._C's at load time.
    return [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-fopenmp", "-w",
            "-fvisibility=hidden", "-fvisibility-inlines-hidden", *_VARIANT_FLAGS[isa],
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-DVLLM_CPU_OPS_NAMESPACE=_cx_{isa}",
            *inc, str(src), "-o", str(lib), *libs]  # fmt: skip


@pytest.fixture(scope="module")
def variant_libs(tmp_path_factory) -> dict[str, str]:
    """csrc/cpu/*.cpp as one unit per ISA, built in parallel and loaded."""
    cxx = _compiler()
    if cxx is None:
        if os.environ.get("VLLM_ALLOW_NO_CSRC") == "1":
            pytest.skip("no C++ compiler (VLLM_ALLOW_NO_CSRC=1)")
        pytest.fail("no C++ compiler to build the ISA variants of csrc/cpu")
    out = tmp_path_factory.mktemp("cpu_ops_isa")
    unity = out / "unity.cpp"
    unity.write_text("".join(f'#include "{p}"\n' for p in sorted(_CSRC.glob("*.cpp"))))
    libs = _cached_builds(cxx)
    procs = {}
    for isa in _VARIANTS:
        if isa in libs:
            continue
        lib = out / f"cx_{isa}.so"
        cmd = _build_cmd(cxx, unity, lib, isa)
        procs[isa] = (lib, subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True))
    for isa, (lib, proc) in procs.items():
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{isa} build failed:\n{err[-3000:]}"
        libs[isa] = _cache_build(cxx, isa, lib)
    macros = _native_macros()
    namespaces = {}
    for isa, lib in libs.items():
        if not all(f"__{f}__" in macros for f in _NEEDS.get(isa, ())):
            continue  # built (it compiles everywhere), but this host cannot run it
        torch.ops.load_library(str(lib))
        namespaces[isa] = f"_cx_{isa}"
    return namespaces


def _cache_key(cxx: str, isa: str) -> str:
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    h = hashlib.sha256(
        "\n".join([version, torch.__version__, str(torch.version.git_version)]).encode()
    )
    # The command with this run's paths left out.
    h.update(" ".join(_build_cmd(cxx, Path("SRC"), Path("LIB"), isa)).encode())
    h.update(Path(__file__).read_bytes())
    for path in sorted(_CSRC.rglob("*")):
        if path.is_file():
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _cache_dir() -> Path | None:
    if os.environ.get("VLLM_TEST_NO_COMPILE_CACHE") == "1":
        return None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "vllm-tests" / "cpu-ops-isa"


def _cached_builds(cxx: str) -> dict[str, Path]:
    """ISA -> a kept build of exactly these sources, where there is one."""
    cache = _cache_dir()
    if cache is None:
        return {}
    found = {isa: cache / f"{_cache_key(cxx, isa)}.so" for isa in _VARIANTS}
    return {isa: lib for isa, lib in found.items() if lib.is_file()}


def _cache_build(cxx: str, isa: str, lib: Path) -> Path:
    """Keep a fresh build (written under a temporary name, then renamed, so a
    concurrent session never loads half a file); returns the path to load."""
    cache = _cache_dir()
    if cache is None:
        return lib
    cache.mkdir(parents=True, exist_ok=True)
    kept = cache / f"{_cache_key(cxx, isa)}.so"
    tmp = kept.with_suffix(f".{os.getpid()}.tmp")
    shutil.copyfile(lib, tmp)
    os.replace(tmp, kept)
    return kept


@pytest.fixture(params=[*_VARIANTS, "native"])
def ns(request, variant_libs):
    """The ops namespace of one build (torch.ops.<ns>)."""
    isa = request.param
    if isa == "native":
        if not (ops.cpu_ops_available() and hasattr(torch.ops._C_cpu, "cpu_ops_isa")):
            pytest.skip("vllm._C not loaded or older than these sources (no cpu_ops_isa)")
        return torch.ops._C_cpu
    if isa not in variant_libs:
        pytest.skip(f"host cannot run the {isa} build")
    return getattr(torch.ops, variant_libs[isa])


def best_native_isa() -> str:
    """The best ISA variant the compiler says this host runs (-march=native)."""
    macros = _native_macros()
    runnable = [isa for isa, need in _NEEDS.items() if all(f"__{f}__" in macros for f in need)]
    return runnable[-1] if runnable else "scalar"  # _NEEDS: ascending


def test_isa_of_build(ns):
    """Each build runs the vector path its flags allow, not a silent scalar
    one; the installed ops (run-time dispatch) the best this host runs."""
    name = ns.name if hasattr(ns, "name") else str(ns)
    got = ns.cpu_ops_isa()
    if name.startswith("_cx_"):
        assert got == name.removeprefix("_cx_")
    elif os.environ.get("VLLM_CPU_ISA", "auto") == "auto":
        assert got == ops.cpu_ops_isa() == best_native_isa()
    else:
        assert got == ops.cpu_ops_isa() == os.environ["VLLM_CPU_ISA"]


DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# One ulp of the 16-bit types, relative (8 and 11 significant bits).
_ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


def _round(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x (fp32) rounded to dtype and back: an intermediate the op stores."""
    return x.to(dtype).float()


def _assert_rounded(out: torch.Tensor, ref: torch.Tensor, fp32_rtol: float = 2e-6) -> None:
    """out (fp32, bf16 or fp16) against ref, the fp32 result of the same math."""
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=fp32_rtol, atol=1e-6, equal_nan=True)
        return
    want = ref.to(out.dtype)
    # One ulp: the fp32 math may sit on the other side of a rounding
    # boundary, but only for a small fraction of elements.
    rtol = _ULP[out.dtype]
    torch.testing.assert_close(out.float(), want.float(), rtol=rtol, atol=1e-6, equal_nan=True)
    differ = (out.float() != want.float()) & ~(out.isnan() & want.isnan())
    assert differ.float().mean().item() <= 0.02, f"{differ.sum().item()} of {out.numel()} differ"


# ---------------------------------------------------------------- layernorm
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [576, 100, 7, 1])
def test_rms_norm(ns, dtype, hidden):
    torch.manual_seed(hidden)
    x = torch.randn(5, hidden).to(dtype)
    w = torch.randn(hidden).to(dtype)
    inv = torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6).float()
    ref = _round(x.float() * inv, dtype) * w.float()
    out = torch.empty_like(x)
    ns.rms_norm(out, x, w, 1e-6)
    _assert_rounded(out, ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [576, 100, 13])
def test_fused_add_rms_norm(ns, dtype, hidden):
    torch.manual_seed(hidden)
    x, res = torch.randn(2, 7, hidden).to(dtype).unbind(0)
    w = torch.randn(hidden).to(dtype)
    total = (x.float() + res.float()).to(dtype)  # the sum as stored
    inv = torch.rsqrt(total.double().pow(2).mean(-1, keepdim=True) + 1e-5).float()
    ref = _round(total.float() * inv, dtype) * w.float()
    out, res_out = torch.empty_like(x), torch.empty_like(x)
    ns.fused_add_rms_norm_out(out, res_out, x, res, w, 1e-5)
    assert torch.equal(res_out, total)
    _assert_rounded(out, ref)
    ns.fused_add_rms_norm(x, res, w, 1e-5)  # in place
    assert torch.equal(res, total)
    assert torch.equal(x, out)


# --------------------------------------------------------------- activation
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [1536, 37, 5])
def test_silu_and_mul(ns, dtype, d):
    torch.manual_seed(d)
    x = (torch.randn(9, 2 * d) * 4).to(dtype)
    x[0, :3] = torch.tensor([float("nan"), 100.0, -100.0])  # NaN, exp clamps
    gate, up = x.float()[:, :d], x.float()[:, d:]
    ref = _round(F.silu(gate.double()).float(), dtype) * up
    out = torch.empty(9, d, dtype=dtype)
    ns.silu_and_mul(out, x)
    _assert_rounded(out, ref, fp32_rtol=1e-5)


# ------------------------------------------------------------------- rotary
def _ref_rope(pos, x, head_size, cache, neox):
    """fp32 rotation of x [T, H * D] (math in float64, one rounding)."""
    rot = cache.shape[1]
    cos, sin = cache[pos].double().unsqueeze(1).chunk(2, dim=-1)
    y = x.view(x.shape[0], -1, head_size).double().clone()
    r = y[..., :rot]
    if neox:
        x1, x2 = r.chunk(2, dim=-1)
        r.copy_(torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1))
    else:
        x1, x2 = r[..., 0::2].clone(), r[..., 1::2].clone()
        r[..., 0::2], r[..., 1::2] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    return y.flatten(1).float()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_size,rot", [(64, 64), (128, 64), (80, 80), (36, 36), (72, 72)])
@pytest.mark.parametrize("neox", [True, False])
def test_rotary_embedding(ns, dtype, head_size, rot, neox):
    torch.manual_seed(head_size + rot)
    t, h, hkv = 6, 3, 1
    qkv = torch.randn(t, (h + 2 * hkv) * head_size).to(dtype)
    q, k = qkv[:, : h * head_size], qkv[:, h * head_size : (h + hkv) * head_size]  # strided views
    cache = torch.randn(50, rot).to(dtype)
    pos = torch.randint(0, 50, (t,))
    ref_q, ref_k = (_ref_rope(pos, x, head_size, cache, neox) for x in (q, k))
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    ns.rotary_embedding_out(pos, q, k, head_size, cache, neox, q_out, k_out)
    _assert_rounded(q_out, ref_q)
    _assert_rounded(k_out, ref_k)
    ns.rotary_embedding(pos, q, k, head_size, cache, neox)  # in place
    assert torch.equal(q, q_out) and torch.equal(k, k_out)


# ---------------------------------------------------------------- attention
def _paged_case(seq_lens, num_kv_heads, gqa, head_size, block_size, dtype):
    """Random caches; each sequence's blocks scattered in a shuffled pool."""
    max_blocks = max((n + block_size - 1) // block_size for n in seq_lens)
    num_blocks = len(seq_lens) * max_blocks + 3
    kc = torch.randn(num_blocks, block_size, num_kv_heads, head_size).to(dtype)
    vc = torch.randn_like(kc)
    perm = torch.randperm(num_blocks)[: len(seq_lens) * max_blocks]
    block_table = perm.view(len(seq_lens), max_blocks).to(torch.int32)
    query = torch.randn(len(seq_lens), num_kv_heads * gqa, head_size).to(dtype)
    return query, kc, vc, block_table, torch.tensor(seq_lens, dtype=torch.int32)


def _assert_attention(out, q, kc, vc, bt, lens, scale, window=None, soft_cap=None):
    ref = ops.ref_paged_attention_decode(
        q.float(), kc.float(), vc.float(), bt, lens, scale, window, soft_cap
    )
    # fp32: softmax weights from a polynomial exp (~1e-7 relative).
    _assert_rounded(out, ref, fp32_rtol=2e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_size", [64, 128, 80, 72, 36, 4])
@pytest.mark.parametrize("block_size", [16, 5])
@pytest.mark.parametrize("num_kv_heads,gqa", [(3, 3), (2, 1)])
def test_paged_attention_decode(ns, dtype, head_size, block_size, num_kv_heads, gqa):
    torch.manual_seed(head_size * block_size + gqa)
    seq_lens = [1, block_size + 1, 3 * block_size + 5, 70]
    q, kc, vc, bt, lens = _paged_case(seq_lens, num_kv_heads, gqa, head_size, block_size, dtype)
    out = torch.empty_like(q)
    scale = head_size**-0.5
    ns.paged_attention_decode(out, q, kc, vc, bt, lens, scale, 0, 0.0)
    _assert_attention(out, q, kc, vc, bt, lens, scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window,soft_cap", [(7, 0.0), (0, 30.0), (20, 5.0)])
def test_paged_attention_decode_window_softcap(ns, dtype, window, soft_cap):
    torch.manual_seed(window)
    q, kc, vc, bt, lens = _paged_case([3, 16, 17, 40, 65], 2, 4, 64, 16, dtype)
    out = torch.empty_like(q)
    ns.paged_attention_decode(out, q, kc, vc, bt, lens, 0.125, window, soft_cap)
    _assert_attention(out, q, kc, vc, bt, lens, 0.125, window or None, soft_cap or None)


# -------------------------------------------------------------------- cache
@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape_and_cache(ns, dtype):
    nb, bs, hkv, d, t = 5, 16, 3, 36, 30
    kv = torch.zeros(2, nb, bs, hkv, d, dtype=dtype)
    key, value = torch.randn(2, t, hkv, d).to(dtype).unbind(0)
    slots = torch.randperm(nb * bs)[:t]
    slots[3] = -1  # padding: not written
    ns.reshape_and_cache(key, value, kv[0], kv[1], slots)
    keep = slots >= 0
    flat = kv.view(2, nb * bs, hkv, d)
    assert torch.equal(flat[0][slots[keep]], key[keep])
    assert torch.equal(flat[1][slots[keep]], value[keep])
    written = torch.zeros(nb * bs, dtype=torch.bool)
    written[slots[keep]] = True
    assert not flat[:, ~written].any()


# ------------------------------------------------------------ grammar mask
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab,words", [(1000, 32), (100, 4), (77, 2), (33, 2), (64, 1)])
def test_apply_token_bitmask(ns, dtype, vocab, words):
    g = torch.Generator().manual_seed(vocab)
    n = 4
    bitmask = torch.randint(-(2**31), 2**31 - 1, (n, words), dtype=torch.int32, generator=g)
    bitmask[0, 0] = -1  # an all-allowed word (the skip path)
    bitmask[2, 0] = 0  # a word with no token allowed
    bitmask[3, -1] = -(2**31)  # only the last bit (the sign bit) set
    logits = torch.randn(n, vocab, generator=g).to(dtype)
    rows = torch.tensor([0, 2, 3])  # row 1 has no grammar: untouched
    bits = (bitmask.unsqueeze(-1) >> torch.arange(32)) & 1  # [n, W, 32], lsb first
    allowed = bits.flatten(1).bool()[:, :vocab]
    allowed = torch.cat([allowed, torch.zeros(n, vocab - allowed.shape[1], dtype=torch.bool)], 1)
    ref = logits.clone()
    ref[rows] = logits[rows].masked_fill(~allowed[rows], float("-inf"))
    ns.apply_token_bitmask(logits, bitmask, rows)
    assert torch.equal(logits, ref)


# ------------------------------------------------------------ panel GEMM
# M crosses the 6-row register tile (1: the decode row loop, 5, 6, 7, 13)
# and the 96-row block (100); K an odd count (the row loop's tail) and one
# longer than the 256-deep slice (300: a partial second slice).
@pytest.mark.parametrize("m", [1, 5, 6, 7, 13, 100])
@pytest.mark.parametrize("k,n", [(300, 48), (33, 16), (1, 32)])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_panel_gemm(ns, m, k, n, with_bias, dtype):
    g = torch.Generator().manual_seed(m * 1000 + k)
    w = torch.randn(n, k, generator=g).to(dtype)
    x = torch.randn(2, m, k, generator=g).to(dtype)[1]  # a view: the op makes it contiguous
    bias = torch.randn(n, generator=g).to(dtype) if with_bias else None
    packed = ops.pack_panels(w)
    assert packed.shape == (n // 16, k, 16) and packed.dtype == dtype
    assert torch.equal(ops.unpack_panels(packed), w)
    ref = F.linear(x.double(), w.double(), None if bias is None else bias.double())
    out = ns.panel_gemm(x, packed, bias)
    assert out.shape == (m, n) and out.dtype == dtype
    # fp32 sums of k products (16-bit inputs are exact in fp32) in another
    # order than float64's, then rounded once to the output dtype.
    scale = 1e-5 * k**0.5
    if dtype == torch.float32:
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=scale)
    else:
        torch.testing.assert_close(out.double(), ref, rtol=_ULP[dtype], atol=scale)


def test_panel_gemm_shapes_and_errors(ns):
    w = torch.randn(32, 8)
    packed = ops.pack_panels(w)
    x = torch.randn(2, 3, 8)  # leading dims kept
    assert ns.panel_gemm(x, packed, None).shape == (2, 3, 32)
    assert ns.panel_gemm(torch.empty(0, 8), packed, None).shape == (0, 32)
    with pytest.raises(RuntimeError, match="x has 7 features, the weight 8"):
        ns.panel_gemm(torch.randn(1, 7), packed, None)
    with pytest.raises(RuntimeError, match="x is BFloat16, the packed weight Float"):
        ns.panel_gemm(x.bfloat16(), packed, None)
    with pytest.raises(RuntimeError, match="bias must have 32 elements"):
        ns.panel_gemm(x, packed, torch.randn(31))
    with pytest.raises(ValueError, match="N % 16 == 0"):
        ops.pack_panels(torch.randn(20, 8))
    with pytest.raises(ValueError, match="float32 / bfloat16 / float16"):
        ops.pack_panels(torch.randn(32, 8).double())


# ------------------------------------------------------- Gumbel-max draw
@pytest.mark.parametrize("rows,vocab", [(1, 32000), (33, 5003), (4, 7), (2, 1)])
def test_gumbel_argmax(ns, rows, vocab):
    """The draw equals the torch path's argmax(logits + noise) (the same hash
    bits, a log within an ulp: no near-tie at these sizes); masked (-inf)
    tokens are never drawn; a NaN logit wins at its first index and an
    all -inf row gives 0, as torch.argmax."""
    from vllm.v1.worker.gpu.sample.gumbel import gumbel_noise, row_keys

    g = torch.Generator().manual_seed(rows * vocab)
    logits = torch.randn(rows, vocab, generator=g) * 3
    keys = row_keys(torch.arange(rows) + 7, torch.arange(rows) * 3)
    masked = torch.rand(rows, vocab, generator=g) < 0.5
    masked[:, 0] = False
    logits[masked] = float("-inf")
    want = torch.argmax(logits + gumbel_noise(keys, vocab), dim=-1)
    out = torch.empty(rows, dtype=torch.int64)
    ns.gumbel_argmax(logits, keys, out)
    assert torch.equal(out, want)
    assert not masked[torch.arange(rows), out].any()
    if vocab >= 7 and rows >= 2:
        logits[0, [vocab - 1, 5]] = float("nan")
        logits[-1] = float("-inf")
        ns.gumbel_argmax(logits, keys, out)
        assert out[0] == 5 and out[-1] == 0
    with pytest.raises(RuntimeError, match="keys must be contiguous int32"):
        ns.gumbel_argmax(logits, keys.long(), out)
