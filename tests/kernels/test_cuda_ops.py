"""The CUDA ops (vllm._C_cuda: torch.ops._C / torch.ops._C_cache_ops, csrc/*.cu)
against torch references, plus the CPU-side wrappers they share.

GPU tests skip with a reason where torch.cuda.is_available() is False. On a
GPU a missing build FAILS with the loader's reason (build it with
`python setup.py build_ext --inplace` under a CUDA torch, or
benchmarks/gpu_check.sh), unless VLLM_ALLOW_NO_CSRC=1 says the run is meant
to go without it. References run in fp32 on the CPU (no TF32 surprises).
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from vllm import _custom_ops as ops

requires_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


@pytest.fixture
def cuda_ops():
    """The compiled CUDA ops must be loaded (or the run says it goes without)."""
    if not ops.cuda_ops_available():
        if os.environ.get("VLLM_ALLOW_NO_CSRC") == "1":
            pytest.skip("vllm._C_cuda not built (VLLM_ALLOW_NO_CSRC=1)")
        pytest.fail(
            f"vllm._C_cuda is not built/loadable: {ops.cuda_ops_load_error()}. "
            "Build it with a CUDA torch: `python setup.py build_ext --inplace`."
        )
    torch.manual_seed(0)
    return torch.ops._C


def _close(out, ref, dtype):
    torch.testing.assert_close(out.cpu().float(), ref.cpu().float(), **TOL[dtype])


# ------------------------------------------------------------------ norms
@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [768, 100, 4096])
def test_rms_norm(cuda_ops, dtype, hidden):
    x = torch.randn(37, hidden, dtype=dtype, device="cuda")
    w = torch.randn(hidden, dtype=dtype, device="cuda")
    out = torch.empty_like(x)
    cuda_ops.rms_norm(out, x, w, 1e-6)
    ref = F.rms_norm(x.cpu().float(), (hidden,), w.cpu().float(), 1e-6)
    _close(out, ref, dtype)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_padded_rows_and_3d(cuda_ops, dtype):
    base = torch.randn(9, 160, dtype=dtype, device="cuda")
    x = base[:, :128]  # rows 160 apart
    w = torch.randn(128, dtype=dtype, device="cuda")
    out = torch.empty(9, 128, dtype=dtype, device="cuda")
    cuda_ops.rms_norm(out, x, w, 1e-5)
    _close(out, F.rms_norm(x.cpu().float(), (128,), w.cpu().float(), 1e-5), dtype)
    x3 = torch.randn(2, 5, 128, dtype=dtype, device="cuda")
    out3 = torch.empty_like(x3)
    ops.rms_norm(out3, x3, w, 1e-5)  # through the wrapper
    _close(out3, F.rms_norm(x3.cpu().float(), (128,), w.cpu().float(), 1e-5), dtype)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [768, 100])
def test_fused_add_rms_norm(cuda_ops, dtype, hidden):
    x = torch.randn(37, hidden, dtype=dtype, device="cuda")
    res = torch.randn_like(x)
    w = torch.randn(hidden, dtype=dtype, device="cuda")
    ref_res = (x + res).cpu()  # rounded to dtype, as the kernel stores it
    ref = F.rms_norm(ref_res.float(), (hidden,), w.cpu().float(), 1e-5)
    cuda_ops.fused_add_rms_norm(x, res, w, 1e-5)
    _close(res, ref_res, dtype)
    _close(x, ref, dtype)
    x0, r0 = torch.randn_like(x), torch.randn_like(x)
    out, res_out = torch.empty_like(x), torch.empty_like(x)
    ops.fused_add_rms_norm_out(out, res_out, x0, r0, w, 1e-5)  # wrapper: add + CUDA rms_norm
    _close(res_out, (x0 + r0).cpu(), dtype)
    _close(out, F.rms_norm((x0 + r0).cpu().float(), (hidden,), w.cpu().float(), 1e-5), dtype)


# -------------------------------------------------------------- activation
@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [2304, 37, 11008])
def test_silu_and_mul(cuda_ops, dtype, d):
    x = torch.randn(19, 2 * d, dtype=dtype, device="cuda")
    out = torch.empty(19, d, dtype=dtype, device="cuda")
    cuda_ops.silu_and_mul(out, x)
    xf = x.cpu().float()
    _close(out, F.silu(xf[:, :d]) * xf[:, d:], dtype)


# ------------------------------------------------------------------ rotary
def _ref_rope(positions, x, head_size, cache, neox):
    rot = cache.shape[1]
    cos, sin = cache[positions].float().unsqueeze(1).chunk(2, dim=-1)
    x = x.reshape(x.shape[0], -1, head_size).float().clone()
    r = x[..., :rot]
    if neox:
        x1, x2 = r.chunk(2, dim=-1)
        r.copy_(torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1))
    else:
        x1, x2 = r[..., 0::2].clone(), r[..., 1::2].clone()
        r[..., 0::2], r[..., 1::2] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    return x.flatten(1)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_size,rot", [(64, 64), (128, 128), (128, 64), (80, 80)])
@pytest.mark.parametrize("neox", [True, False])
def test_rotary_embedding(cuda_ops, dtype, head_size, rot, neox):
    t, h, hkv = 23, 8, 2
    qkv = torch.randn(t, (h + 2 * hkv) * head_size, dtype=dtype, device="cuda")
    q = qkv[:, : h * head_size]  # strided row views of the fused projection
    k = qkv[:, h * head_size : (h + hkv) * head_size]
    cache = torch.randn(300, rot, dtype=dtype, device="cuda")
    pos = torch.randint(0, 300, (t,), device="cuda")
    ref_q, ref_k = (_ref_rope(pos.cpu(), x.cpu(), head_size, cache.cpu(), neox) for x in (q, k))
    rest = qkv[:, (h + hkv) * head_size :].clone()
    cuda_ops.rotary_embedding(pos, q, k, head_size, cache, neox)
    _close(q, ref_q, dtype)
    _close(k, ref_k, dtype)
    assert torch.equal(qkv[:, (h + hkv) * head_size :], rest)  # value untouched


@requires_cuda
@pytest.mark.parametrize("neox", [True, False])
def test_rotary_embedding_3d_no_key_and_wrapper(cuda_ops, neox):
    t, h, d = 17, 4, 64
    q = torch.randn(t, h, d, dtype=torch.bfloat16, device="cuda")
    cache = torch.randn(64, d, dtype=torch.bfloat16, device="cuda")
    pos = torch.randint(0, 64, (t,), device="cuda", dtype=torch.int32)  # wrapper widens
    ref = _ref_rope(pos.cpu().long(), q.cpu(), d, cache.cpu(), neox)
    ops.rotary_embedding(pos, q, None, d, cache, neox)
    _close(q.flatten(1), ref, torch.bfloat16)


# ------------------------------------------------------------------- cache
def _kv_rows(t, hkv, d, dtype, device):
    """key/value [t, hkv, d] as strided row views of a fused qkv tensor."""
    qkv = torch.randn(t, (4 + 2 * hkv) * d, dtype=dtype, device=device)
    key = qkv[:, 4 * d : (4 + hkv) * d].view(t, hkv, d)
    value = qkv[:, (4 + hkv) * d :].view(t, hkv, d)
    return key, value


def _slots(t, nb, bs, slot_dtype, device):
    slots = torch.randperm(nb * bs)[:t].to(slot_dtype)
    slots[3] = -1  # padding: not written
    slots[-1] = -1
    return slots.to(device)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
def test_reshape_and_cache_flash(cuda_ops, dtype, block_size, head_size, slot_dtype):
    nb, hkv, t = 9, 2, 40
    kv = torch.zeros(2, nb, block_size, hkv, head_size, dtype=dtype, device="cuda")
    key, value = _kv_rows(t, hkv, head_size, dtype, "cuda")
    slots = _slots(t, nb, block_size, slot_dtype, "cuda")
    one = torch.ones((), device="cuda")
    torch.ops._C_cache_ops.reshape_and_cache_flash(
        key, value, kv[0], kv[1], slots, "auto", one, one
    )
    keep = (slots >= 0).cpu()
    s = slots.cpu()[keep].long()
    flat = kv.cpu().view(2, nb * block_size, hkv, head_size)
    assert torch.equal(flat[0][s], key.cpu()[keep])
    assert torch.equal(flat[1][s], value.cpu()[keep])
    written = torch.zeros(nb * block_size, dtype=torch.bool)
    written[s] = True
    assert not flat[:, ~written].any()
    with pytest.raises(RuntimeError, match="not built"):
        torch.ops._C_cache_ops.reshape_and_cache_flash(
            key, value, kv[0], kv[1], slots, "fp8", one, one
        )


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_size", [64, 128])
def test_reshape_and_cache_split_layout(cuda_ops, dtype, block_size, head_size):
    nb, hkv, t = 7, 4, 30
    x = 16 // torch.tensor([], dtype=dtype).element_size()
    kc = torch.zeros(nb, hkv, head_size // x, block_size, x, dtype=dtype, device="cuda")
    vc = torch.zeros(nb, hkv, head_size, block_size, dtype=dtype, device="cuda")
    key, value = _kv_rows(t, hkv, head_size, dtype, "cuda")
    slots = _slots(t, nb, block_size, torch.int64, "cuda")
    one = torch.ones((), device="cuda")
    torch.ops._C_cache_ops.reshape_and_cache(key, value, kc, vc, slots, "auto", one, one)
    fk, fv = ops.split_kv_cache_to_flash(kc.cpu(), vc.cpu())
    keep = (slots >= 0).cpu()
    s = slots.cpu()[keep]
    assert torch.equal(fk.reshape(-1, hkv, head_size)[s], key.cpu()[keep])
    assert torch.equal(fv.reshape(-1, hkv, head_size)[s], value.cpu()[keep])
    assert int((fk != 0).any(-1).any(-1).sum()) == len(s)  # nothing else written


# --------------------------------------------------------------- attention
def _paged_case(seq_lens, num_kv_heads, gqa, head_size, block_size, dtype, device):
    """Random flash-layout caches; each sequence's blocks are scattered."""
    max_blocks = max((n + block_size - 1) // block_size for n in seq_lens)
    num_blocks = len(seq_lens) * max_blocks + 3
    kc = torch.randn(num_blocks, block_size, num_kv_heads, head_size, dtype=dtype)
    vc = torch.randn_like(kc)
    perm = torch.randperm(num_blocks)[: len(seq_lens) * max_blocks]
    block_table = perm.view(len(seq_lens), max_blocks).to(torch.int32)
    query = torch.randn(len(seq_lens), num_kv_heads * gqa, head_size, dtype=dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    return [t.to(device) for t in (query, kc, vc, block_table, lens)]


def _seq_lens(block_size):
    """Lengths around block boundaries, one long enough for every warp."""
    return [1, block_size - 1, block_size, block_size + 1, 3 * block_size + 5, 517]


def _ref(q, kc, vc, bt, lens, scale, **kw):
    return ops.ref_paged_attention_decode(
        q.cpu().float(), kc.cpu().float(), vc.cpu().float(), bt.cpu(), lens.cpu(), scale, **kw
    )


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("gqa", [1, 4])
@pytest.mark.parametrize("block_size", [16, 32])
def test_paged_attention_decode(cuda_ops, dtype, head_size, gqa, block_size):
    q, kc, vc, bt, lens = _paged_case(
        _seq_lens(block_size), 2, gqa, head_size, block_size, dtype, "cuda"
    )
    out = torch.empty_like(q)
    scale = head_size**-0.5
    cuda_ops.paged_attention_decode(out, q, kc, vc, bt, lens, scale, 0, 0.0)
    _close(out, _ref(q, kc, vc, bt, lens, scale), dtype)


@requires_cuda
@pytest.mark.parametrize("head_size", [8, 80, 96, 256])
@pytest.mark.parametrize("window,soft_cap", [(0, 0.0), (7, 0.0), (0, 30.0), (20, 5.0)])
def test_paged_attention_decode_head_sizes_window_softcap(cuda_ops, head_size, window, soft_cap):
    q, kc, vc, bt, lens = _paged_case(
        [3, 16, 17, 40, 64, 200], 2, 3, head_size, 16, torch.bfloat16, "cuda"
    )
    bt = bt.long()  # int64 block tables are read too
    out = torch.empty_like(q)
    cuda_ops.paged_attention_decode(out, q, kc, vc, bt, lens, 0.125, window, soft_cap)
    ref = _ref(q, kc, vc, bt, lens, 0.125, sliding_window=window or None, soft_cap=soft_cap or None)
    _close(out, ref, torch.bfloat16)


@requires_cuda
def test_wrappers_take_the_sync_free_cuda_ops(cuda_ops):
    """ops.reshape_and_cache / ops.paged_attention_decode on CUDA tensors (KV
    caches as the halves of one (2, NB, BS, Hkv, D) tensor) run the CUDA
    ops: the torch fallbacks would synchronize (nonzero, tolist), which
    sync debug mode turns into an error."""
    q, kc, vc, bt, lens = _paged_case([5, 33, 64], 2, 4, 128, 16, torch.float16, "cuda")
    kv = torch.stack([kc, vc])
    key, value = _kv_rows(10, 2, 128, torch.float16, "cuda")
    slots = _slots(10, kc.shape[0], 16, torch.int64, "cuda")
    out = torch.empty_like(q)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ops.reshape_and_cache(key, value, kv[0], kv[1], slots)
        ops.paged_attention_decode(out, q, kv[0], kv[1], bt, lens.long(), 0.1)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    keep = (slots >= 0).cpu()
    flat = kv.cpu().view(2, -1, 2, 128)
    assert torch.equal(flat[0][slots.cpu()[keep]], key.cpu()[keep])
    # The reference reads the caches as written above.
    _close(out, _ref(q, kv[0], kv[1], bt, lens, 0.1), torch.float16)


def _to_split(kc: torch.Tensor, vc: torch.Tensor):
    """Flash caches [NB, BS, Hkv, D] in upstream's split layout."""
    nb, bs, hkv, d = kc.shape
    x = 16 // kc.element_size()
    key = kc.view(nb, bs, hkv, d // x, x).permute(0, 2, 3, 1, 4).contiguous()
    value = vc.permute(0, 2, 3, 1).contiguous()
    return key, value


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("gqa", [1, 4])
@pytest.mark.parametrize("block_size", [16, 32])
def test_paged_attention_v1(cuda_ops, dtype, head_size, gqa, block_size):
    q, kc, vc, bt, lens = _paged_case(
        _seq_lens(block_size), 2, gqa, head_size, block_size, dtype, "cuda"
    )
    key, value = _to_split(kc, vc)
    out = torch.empty_like(q)
    one = torch.ones((), device="cuda")
    scale = head_size**-0.5
    cuda_ops.paged_attention_v1(
        out,
        q,
        key,
        value,
        2,
        scale,
        bt,
        lens,
        block_size,
        int(lens.max()),
        None,
        "auto",
        one,
        one,
        0,
        0,
        0,
        64,
        0,
    )
    _close(out, _ref(q, kc, vc, bt, lens, scale), dtype)
    slopes = torch.linspace(-0.3, -0.01, q.shape[1], device="cuda")
    ops.paged_attention_v1(
        out,
        q,
        key,
        value,
        2,
        scale,
        bt,
        lens,
        block_size,
        int(lens.max()),
        slopes,
        "auto",
        one,
        one,
    )
    _close(out, _ref(q, kc, vc, bt, lens, scale, alibi_slopes=slopes.cpu()), dtype)


# ------------------------------------------- CPU side of the same wrappers
def test_paged_attention_v1_fallback_matches_dense_alibi():
    """The torch path of ops.paged_attention_v1 (split layout, ALiBi) against
    dense per-head attention written out here."""
    torch.manual_seed(0)
    q, kc, vc, bt, lens = _paged_case([5, 16, 21], 2, 2, 64, 16, torch.float32, "cpu")
    key, value = _to_split(kc, vc)
    slopes = torch.tensor([-0.5, -0.25, -0.125, -0.0625])
    out = torch.empty_like(q)
    one = torch.ones(())
    ops.paged_attention_v1(out, q, key, value, 2, 0.125, bt, lens, 16, 21, slopes, "auto", one, one)
    for b, n in enumerate(lens.tolist()):
        blocks = bt[b, : (n + 15) // 16].long()
        k = kc[blocks].reshape(-1, 2, 64)[:n]
        v = vc[blocks].reshape(-1, 2, 64)[:n]
        for h in range(4):
            s = (k[:, h // 2] @ q[b, h]) * 0.125 + slopes[h] * (torch.arange(n) - (n - 1))
            torch.testing.assert_close(out[b, h], torch.softmax(s, 0) @ v[:, h // 2])
    with pytest.raises(NotImplementedError, match="fp8"):
        ops.paged_attention_v1(out, q, key, value, 2, 0.1, bt, lens, 16, 21, None, "fp8", one, one)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reshape_and_cache_flash_wrapper_cpu(dtype):
    torch.manual_seed(0)
    nb, bs, hkv, d, t = 6, 16, 2, 64, 20
    kv = torch.zeros(2, nb, bs, hkv, d, dtype=dtype)
    key, value = _kv_rows(t, hkv, d, dtype, "cpu")
    slots = _slots(t, nb, bs, torch.int64, "cpu")
    one = torch.ones(())
    ops.reshape_and_cache_flash(key, value, kv[0], kv[1], slots, "auto", one, one)
    keep = slots >= 0
    flat = kv.view(2, nb * bs, hkv, d)
    assert torch.equal(flat[0][slots[keep]], key[keep])
    assert torch.equal(flat[1][slots[keep]], value[keep])
    with pytest.raises(NotImplementedError, match="fp8"):
        ops.reshape_and_cache_flash(key, value, kv[0], kv[1], slots, "fp8", one, one)


def test_cuda_ops_load_state_is_explained():
    """Without the CUDA library the reason is given, and CPU tensors never
    take the CUDA path."""
    assert ops.cuda_ops_available() == (ops.cuda_ops_load_error() is None)
    if torch.version.cuda is None:
        assert ops.cuda_ops_load_error() == "torch is not a CUDA build"
    assert not ops._use_cuda(torch.zeros(2))
