"""FLASHINFER backend: selection rules, page metadata, KV writes (CPU) and
FlashInfer's output against a dense reference (CUDA + flashinfer only)."""

from __future__ import annotations

import pytest
import torch

from vllm.config import VllmConfig
from vllm.platforms.cpu import CpuPlatform
from vllm.platforms.cuda import CudaPlatform
from vllm.utils import cdiv
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends import registry
from vllm.v1.attention.backends.flashinfer import (
    FlashInferBackend,
    FlashInferImpl,
    compute_paged_kv_metadata,
    kv_write_rows,
    write_to_paged_kv_cache,
)
from vllm.v1.attention.backends.registry import (
    AttentionBackendEnum,
    AttentionBackendUnavailableError,
    module_available,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec


def _select(platform, head_size=128, dtype=torch.bfloat16, kv_cache_dtype="auto"):
    return platform.get_attn_backend_cls("FLASHINFER", head_size, dtype, kv_cache_dtype, 16)


# ------------------------------------------------------------------ selection
def test_cpu_refuses_flashinfer():
    with pytest.raises(AttentionBackendUnavailableError, match="FLASHINFER.*cannot run on CPU"):
        _select(CpuPlatform)


@pytest.mark.skipif(module_available("flashinfer"), reason="flashinfer is installed here")
def test_cuda_without_flashinfer_names_the_package():
    with pytest.raises(AttentionBackendUnavailableError, match="flashinfer is not installed"):
        _select(CudaPlatform)


def test_cuda_rules_when_installed(monkeypatch):
    """With the package present, dtype / head size / KV dtype decide."""
    real = registry.module_available
    monkeypatch.setattr(
        registry, "module_available", lambda name: name == "flashinfer" or real(name)
    )
    assert _select(CudaPlatform) == AttentionBackendEnum.FLASHINFER.get_path()
    assert _select(CudaPlatform, head_size=64, dtype=torch.float16).endswith("FlashInferBackend")
    with pytest.raises(AttentionBackendUnavailableError, match="float16 / bfloat16 only"):
        _select(CudaPlatform, dtype=torch.float32)
    with pytest.raises(AttentionBackendUnavailableError, match="head size 80"):
        _select(CudaPlatform, head_size=80)
    with pytest.raises(AttentionBackendUnavailableError, match="kv_cache_dtype 'fp8'"):
        _select(CudaPlatform, kv_cache_dtype="fp8")
    # Never the default: unrequested, CUDA keeps its Triton / torch choice.
    assert (
        CudaPlatform.get_attn_backend_cls(None, 128, torch.bfloat16, "auto", 16)
        != AttentionBackendEnum.FLASHINFER.get_path()
    )


def test_backend_class_resolves_without_flashinfer():
    assert FlashInferBackend.get_name() == "FLASHINFER"
    assert FlashInferBackend.get_kv_cache_shape(3, 16, 2, 64) == (3, 2, 16, 2, 64)
    assert FlashInferBackend.supports_head_size(128)
    assert not FlashInferBackend.supports_head_size(96)
    with pytest.raises(NotImplementedError, match="ALiBi"):
        FlashInferImpl(4, 64, 0.125, 2, alibi_slopes=[1.0] * 4)
    with pytest.raises(ValueError, match="multiple"):
        FlashInferImpl(6, 64, 0.125, 4)
    assert FlashInferImpl(4, 64, 0.125, 2, sliding_window=8).window_left == 7
    assert FlashInferImpl(4, 64, 0.125, 2).window_left == -1


# -------------------------------------------------------------- page metadata
def test_paged_kv_metadata_hand_example():
    # block_size 4: seq 9 -> 3 pages (last holds 1), seq 8 -> 2 full pages,
    # seq 1 -> 1 page holding 1 token. Unused table columns are never read.
    block_table = torch.tensor([[7, 3, 9, 0], [2, 5, 99, 99], [11, 99, 99, 99]], dtype=torch.int32)
    md = compute_paged_kv_metadata(block_table, torch.tensor([9, 8, 1], dtype=torch.int32), 4)
    assert md.indptr.tolist() == [0, 3, 5, 6]
    assert md.indices.tolist() == [7, 3, 9, 2, 5, 11]
    assert md.last_page_len.tolist() == [1, 4, 1]
    assert md.indptr.dtype == md.indices.dtype == md.last_page_len.dtype == torch.int32


def test_paged_kv_metadata_bad_input():
    table = torch.zeros(2, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="at least one key"):
        compute_paged_kv_metadata(table, torch.tensor([3, 0]), 4)
    with pytest.raises(ValueError, match="more than the block table"):
        compute_paged_kv_metadata(table, torch.tensor([3, 9]), 4)
    with pytest.raises(ValueError, match="does not match"):
        compute_paged_kv_metadata(table, torch.tensor([3]), 4)


def test_kv_write_lands_in_nhd_layout():
    nb, bs, hkv, d = 5, 4, 2, 8
    kv_cache = torch.zeros(FlashInferBackend.get_kv_cache_shape(nb, bs, hkv, d))
    key, value = torch.randn(3, hkv, d), torch.randn(3, hkv, d)
    slots = torch.tensor([13, 2, -1])  # block 3 offset 1, block 0 offset 2, padding
    keep = torch.tensor([0, 1])
    write_to_paged_kv_cache(key, value, kv_cache, kv_write_rows(slots[keep], bs), keep)
    torch.testing.assert_close(kv_cache[3, 0, 1], key[0])
    torch.testing.assert_close(kv_cache[3, 1, 1], value[0])
    torch.testing.assert_close(kv_cache[0, 0, 2], key[1])
    torch.testing.assert_close(kv_cache[0, 1, 2], value[1])
    assert torch.count_nonzero(kv_cache) == 4 * hkv * d


# --------------------------------------------------------------- the batch
# (num_computed, query_len), decodes first as the runner orders them.
MIXED = [(37, 1), (15, 1), (0, 1), (0, 23), (32, 17), (45, 30)]


def _batch(reqs, num_heads, num_kv_heads, head_size, block_size, dtype, device, pad=0):
    """Random K/V for whole sequences, the cached prefixes written, and the
    step's inputs with `pad` padding rows (slot -1)."""
    gen = torch.Generator().manual_seed(0)
    seq_lens = [c + q for c, q in reqs]
    pages = [cdiv(s, block_size) for s in seq_lens]
    num_blocks = sum(pages) + 3
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.zeros(len(reqs), max(pages) + 1, dtype=torch.int32)
    start = 0
    for i, n in enumerate(pages):
        table[i, :n] = perm[start : start + n].to(torch.int32)
        start += n
    kv_cache = torch.zeros(
        FlashInferBackend.get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size),
        dtype=dtype,
    )

    def slots(i, a, b):
        pos = torch.arange(a, b)
        return table[i, pos // block_size].long() * block_size + pos % block_size

    full_k = [torch.randn(s, num_kv_heads, head_size, generator=gen).to(dtype) for s in seq_lens]
    full_v = [torch.randn(s, num_kv_heads, head_size, generator=gen).to(dtype) for s in seq_lens]
    qs = [torch.randn(q, num_heads, head_size, generator=gen).to(dtype) for _, q in reqs]
    for i, (c, _) in enumerate(reqs):
        write_to_paged_kv_cache(
            full_k[i][:c], full_v[i][:c], kv_cache, kv_write_rows(slots(i, 0, c), block_size), None
        )
    q = torch.cat(qs + [torch.randn(pad, num_heads, head_size).to(dtype)])
    k = torch.cat(
        [fk[c:] for fk, (c, _) in zip(full_k, reqs)]
        + [torch.randn(pad, num_kv_heads, head_size).to(dtype)]
    )
    v = torch.cat(
        [fv[c:] for fv, (c, _) in zip(full_v, reqs)]
        + [torch.randn(pad, num_kv_heads, head_size).to(dtype)]
    )
    slot_mapping = torch.cat(
        [slots(i, c, c + n) for i, (c, n) in enumerate(reqs)] + [torch.full((pad,), -1)]
    )
    qlens = torch.tensor([n for _, n in reqs], dtype=torch.int32)
    qsl = torch.cat([torch.zeros(1, dtype=torch.int32), qlens.cumsum(0).to(torch.int32)])
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    cm = CommonAttentionMetadata(
        query_start_loc=qsl.to(device),
        query_start_loc_cpu=qsl,
        seq_lens=seq.to(device),
        seq_lens_cpu=seq,
        num_computed_tokens_cpu=seq - qlens,
        num_reqs=len(reqs),
        num_actual_tokens=int(qlens.sum()),
        max_query_len=int(qlens.max()),
        max_seq_len=int(seq.max()),
        block_table_tensor=table.to(device),
        slot_mapping=slot_mapping.to(device),
    )
    t = lambda x: x.to(device)  # noqa: E731
    return t(q), t(k), t(v), t(kv_cache), cm, qs, full_k, full_v


def _builder(block_size, num_kv_heads, head_size, dtype, device):
    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=num_kv_heads, head_size=head_size, dtype=dtype
    )
    return FlashInferBackend.get_builder_cls()(spec, ["layer"], VllmConfig(), device)


def test_builder_splits_and_describes_the_batch():
    """Pure torch: the metadata the wrappers would be planned with."""
    bs = 16
    q, k, v, kv_cache, cm, *_ = _batch(MIXED, 4, 2, 64, bs, torch.float32, "cpu", pad=3)
    md = _builder(bs, 2, 64, torch.float32, torch.device("cpu")).build(0, cm)
    assert (md.num_decodes, md.num_decode_tokens, md.num_prefills) == (3, 3, 3)
    assert md.prefill_qo_indptr.tolist() == [0, 23, 40, 70]
    assert md.decode_kv.indptr.tolist() == [0, 3, 1 + 3, 1 + 3 + 1]
    assert md.decode_kv.last_page_len.tolist() == [38 - 32, 16, 1]
    assert md.prefill_kv.indptr.tolist() == [0, 2, 2 + 4, 2 + 4 + 5]
    assert md.prefill_kv.last_page_len.tolist() == [7, 1, 11]
    assert md.prefill_kv.indices.tolist()[:2] == cm.block_table_tensor[3, :2].tolist()
    # Rows past num_actual_tokens (runner padding) are never written.
    assert md.write_token_ids is None
    assert md.key_rows.tolist() == kv_write_rows(cm.slot_mapping[:73], bs).tolist()
    # A real-token row with slot -1 (not to be cached) is skipped by index.
    cm.slot_mapping[5] = -1
    md = _builder(bs, 2, 64, torch.float32, torch.device("cpu")).build(0, cm)
    assert md.write_token_ids.tolist() == [i for i in range(73) if i != 5]
    assert len(md.key_rows) == 72


def _reference(q, k, v, num_computed, scale, window, soft_cap):
    """Dense causal attention of one request in float64: q [Lq, H, D], k/v the
    whole sequence [L, Hkv, D] -> [Lq, H, D]."""
    g = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(g, dim=1)
    v = v.double().repeat_interleave(g, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    if soft_cap:
        s = soft_cap * torch.tanh(s / soft_cap)
    q_pos = torch.arange(q.shape[0])[:, None] + num_computed
    k_pos = torch.arange(k.shape[0])[None, :]
    allowed = k_pos <= q_pos
    if window:
        allowed &= k_pos > q_pos - window
    return torch.einsum("hqk,khd->qhd", s.masked_fill(~allowed, float("-inf")).softmax(-1), v)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlashInfer runs on CUDA GPUs only")
@pytest.mark.skipif(
    not module_available("flashinfer"), reason="the optional flashinfer package is not installed"
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_size", [(8, 2, 128), (4, 4, 64)])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("window,soft_cap", [(None, None), (20, None), (None, 30.0)])
def test_flashinfer_matches_reference(
    dtype, num_heads, num_kv_heads, head_size, block_size, window, soft_cap
):
    device = torch.device("cuda")
    q, k, v, kv_cache, cm, qs, full_k, full_v = _batch(
        MIXED, num_heads, num_kv_heads, head_size, block_size, dtype, device, pad=2
    )
    scale = head_size**-0.5
    md = _builder(block_size, num_kv_heads, head_size, dtype, device).build(0, cm)
    impl = FlashInferImpl(
        num_heads, head_size, scale, num_kv_heads, sliding_window=window, logits_soft_cap=soft_cap
    )
    out = impl.forward(None, q, k, v, kv_cache, md, output=torch.empty_like(q)).cpu()
    start = 0
    for i, (c, n) in enumerate(MIXED):
        ref = _reference(qs[i], full_k[i], full_v[i], c, scale, window, soft_cap)
        torch.testing.assert_close(out[start : start + n].double(), ref, atol=2e-2, rtol=2e-2)
        start += n
    assert torch.count_nonzero(out[start:]) == 0
