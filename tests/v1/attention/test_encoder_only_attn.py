"""Encoder-only (bidirectional, cache-less) attention on the CPU backend and
the KV-cache set-up around it, against dense attention in float64."""

from __future__ import annotations

import pytest
import torch

from vllm.attention.layers.encoder_only_attention import (
    EncoderOnlyAttention,
    create_encoder_only_attention_backend,
)
from vllm.config import CacheConfig, VllmConfig, set_current_vllm_config
from vllm.forward_context import set_forward_context
from vllm.v1.attention.backend import AttentionType, CommonAttentionMetadata
from vllm.v1.attention.backends import cpu_attn
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl
from vllm.v1.attention.backends.cpu_encoder_attn import _fused_rows, plan_buckets
from vllm.v1.kv_cache_interface import (
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.worker import kv_cache_setup

HEAD_SIZE, NUM_HEADS, NUM_KV_HEADS = 16, 4, 2
# One-token requests stay prefills here: nothing is cached, there is no decode.
LENGTHS = [5, 1, 40, 17, 1]


@pytest.fixture(params=["matmul", "sdpa"])
def prefill_path(request, monkeypatch):
    """Both paths: grouped matmuls (small requests) and SDPA (big ones)."""
    monkeypatch.setattr(cpu_attn, "_SDPA_MIN_SCORES", 0 if request.param == "sdpa" else 10**9)
    return request.param


def _common(lengths: list[int], computed: list[int] | None = None) -> CommonAttentionMetadata:
    computed = computed or [0] * len(lengths)
    qsl = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
    seq = torch.tensor([c + n for c, n in zip(computed, lengths)], dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl,
        seq_lens=seq,
        seq_lens_cpu=seq,
        num_computed_tokens_cpu=torch.tensor(computed, dtype=torch.int32),
        num_reqs=len(lengths),
        num_actual_tokens=sum(lengths),
        max_query_len=max(lengths),
        max_seq_len=int(seq.max()),
        block_table_tensor=torch.zeros(len(lengths), 1, dtype=torch.int32),
        slot_mapping=torch.full((sum(lengths),), -1, dtype=torch.int64),
    )


def _dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [L, H, D], k/v [L, Hkv, D] -> [L, H, D], every query over every key."""
    g = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(g, dim=1)
    v = v.double().repeat_interleave(g, dim=1)
    probs = (torch.einsum("qhd,khd->hqk", q.double(), k) * scale).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, v)


def _builder(vllm_config: VllmConfig):
    backend = create_encoder_only_attention_backend(CPUAttentionBackend)
    spec = EncoderOnlyAttentionSpec(
        block_size=16, num_kv_heads=NUM_KV_HEADS, head_size=HEAD_SIZE, dtype=torch.float32
    )
    return backend.get_builder_cls()(spec, ["layer"], vllm_config, torch.device("cpu"))


@pytest.mark.parametrize("padding", [0, 3])
def test_bidirectional_per_request(prefill_path, padding):
    """Each request attends over all of its own tokens (none of another's);
    rows past the real tokens are zero and the empty cache is never touched."""
    gen = torch.Generator().manual_seed(0)
    n = sum(LENGTHS)
    q = torch.randn(n + padding, NUM_HEADS, HEAD_SIZE, generator=gen)
    k = torch.randn(n + padding, NUM_KV_HEADS, HEAD_SIZE, generator=gen)
    v = torch.randn(n + padding, NUM_KV_HEADS, HEAD_SIZE, generator=gen)
    md = _builder(VllmConfig()).build(0, _common(LENGTHS))
    assert md.num_decodes == 0 and md.num_prefills == len(LENGTHS) and not md.causal
    impl = CPUAttentionBackendImpl(
        NUM_HEADS, HEAD_SIZE, 0.3, NUM_KV_HEADS, attn_type=AttentionType.ENCODER_ONLY
    )
    out = impl.forward(None, q, k, v, torch.tensor([]), md, output=torch.full_like(q, 7.0))
    start = 0
    for length in LENGTHS:
        s, e = start, start + length
        ref = _dense(q[s:e], k[s:e], v[s:e], 0.3)
        torch.testing.assert_close(out[s:e].double(), ref, atol=1e-5, rtol=1e-5)
        start = e
    assert bool((out[n:] == 0).all())


# Lengths that make padded buckets: sorted 40 | 29 28 25 | 12 | 8 8 | 5 4 | 1 1
# (a bucket closes below 0.75 x its longest); qkv rows interleaved as a fused
# projection leaves them (strided views), and padding rows past the step.
BUCKET_LENGTHS = [8, 29, 1, 28, 5, 40, 8, 25, 4, 12, 1]


def test_plan_buckets_groups_by_length():
    singles, buckets = plan_buckets(
        [0, *torch.tensor(BUCKET_LENGTHS).cumsum(0).tolist()[:-1]],
        BUCKET_LENGTHS,
        torch.device("cpu"),
    )
    assert [BUCKET_LENGTHS[i] for i in singles] == [40, 12]
    assert [(b.num_seqs, b.padded_len) for b in buckets] == [(3, 29), (2, 8), (2, 5), (2, 1)]
    assert [b.key_mask is None for b in buckets] == [False, True, False, True]
    assert sum(len(b.token_ids) for b in buckets) == sum(BUCKET_LENGTHS) - 52
    three = buckets[0]  # lengths 29, 28, 25: the 28-token request's slot 28 is masked
    assert three.key_mask is not None
    assert three.key_mask[1, 0, 0].tolist() == [True] * 28 + [False]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bucketed_step_matches_dense(prefill_path, dtype):
    """A step of many requests (bucketed + attended alone) equals dense
    attention per request; GQA; padding rows past the step stay zero."""
    gen = torch.Generator().manual_seed(2)
    n, pad = sum(BUCKET_LENGTHS), 2
    hd, kvd = NUM_HEADS * HEAD_SIZE, NUM_KV_HEADS * HEAD_SIZE
    qkv = torch.randn(n + pad, hd + 2 * kvd, generator=gen).to(dtype)
    q, k, v = qkv.split([hd, kvd, kvd], dim=1)
    q, k, v = q.view(-1, NUM_HEADS, HEAD_SIZE), k.view(-1, 2, HEAD_SIZE), v.view(-1, 2, HEAD_SIZE)
    assert _fused_rows(q, k, v) is not None  # one gather per bucket for all three
    assert _fused_rows(q, v, k) is None
    md = _builder(VllmConfig()).build(0, _common(BUCKET_LENGTHS))
    impl = CPUAttentionBackendImpl(
        NUM_HEADS, HEAD_SIZE, 0.3, NUM_KV_HEADS, attn_type=AttentionType.ENCODER_ONLY
    )
    out = impl.forward(None, q, k, v, torch.tensor([]), md, output=torch.full_like(q, 7.0))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    start = 0
    for length in BUCKET_LENGTHS:
        s, e = start, start + length
        ref = _dense(q[s:e], k[s:e], v[s:e], 0.3)
        torch.testing.assert_close(out[s:e].double(), ref, atol=tol, rtol=tol)
        start = e
    assert bool((out[n:] == 0).all())


def test_partial_sequence_and_mismatched_layer_refused():
    """A request with tokens from an earlier step cannot be attended
    bidirectionally; a decoder layer given non-causal metadata (or the reverse)
    is an error, not a silent causal / non-causal mix."""
    builder = _builder(VllmConfig())
    with pytest.raises(ValueError, match="whole sequence in one step"):
        builder.build(0, _common([3, 4], computed=[0, 5]))
    md = builder.build(0, _common([3]))
    decoder = CPUAttentionBackendImpl(NUM_HEADS, HEAD_SIZE, 0.3, NUM_KV_HEADS)
    x = torch.randn(3, NUM_HEADS, HEAD_SIZE)
    kv = torch.randn(3, NUM_KV_HEADS, HEAD_SIZE)
    with pytest.raises(ValueError, match="disagree"):
        decoder.forward(None, x, kv, kv, torch.tensor([]), md)
    with pytest.raises(NotImplementedError, match="sliding"):
        CPUAttentionBackendImpl(
            NUM_HEADS, HEAD_SIZE, 0.3, NUM_KV_HEADS, sliding_window=4, attn_type="encoder_only"
        )


def test_layer_has_no_kv_cache_and_runner_group():
    """The layer asks for no KV cache; the runner's copy of the config gets a
    cache-less EncoderOnlyAttentionSpec group over it (the scheduler's copy is
    unchanged), which gets no tensor, and whose builder marks steps non-causal."""
    vllm_config = VllmConfig(cache_config=CacheConfig(block_size=16))
    with set_current_vllm_config(vllm_config):
        layer = EncoderOnlyAttention(
            NUM_HEADS, HEAD_SIZE, 0.25, num_kv_heads=NUM_KV_HEADS, prefix="enc.attn"
        )
    assert layer.attn_type == AttentionType.ENCODER_ONLY
    assert layer.get_kv_cache_spec(vllm_config) is None
    assert kv_cache_setup.get_kv_cache_spec(vllm_config) == {}
    assert issubclass(layer.get_attn_backend(), CPUAttentionBackend)
    with pytest.raises(ValueError, match="ENCODER_ONLY"):
        EncoderOnlyAttention(NUM_HEADS, HEAD_SIZE, 0.25, attn_type="decoder", prefix="x")

    scheduler_config = KVCacheConfig(num_blocks=1, kv_cache_tensors=[], kv_cache_groups=[])
    runner_config = kv_cache_setup.add_encoder_only_layers_to_kv_cache_config(
        scheduler_config, vllm_config
    )
    assert scheduler_config.kv_cache_groups == []
    (group,) = runner_config.kv_cache_groups
    assert group.layer_names == ["enc.attn"]
    assert group.kv_cache_spec == EncoderOnlyAttentionSpec(
        block_size=16, num_kv_heads=NUM_KV_HEADS, head_size=HEAD_SIZE, dtype=torch.float32
    )
    attn_groups = kv_cache_setup.make_attn_groups(runner_config, vllm_config, torch.device("cpu"))
    caches = kv_cache_setup.allocate_and_bind_kv_caches(
        runner_config, attn_groups, vllm_config, torch.device("cpu")
    )
    assert caches == [] and layer.kv_cache[0].numel() == 0

    # The layer end to end: its group's builder makes the step non-causal.
    md = attn_groups[0][0].metadata_builder.build(0, _common([6, 2]))
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(8, NUM_HEADS * HEAD_SIZE, generator=gen)
    k = torch.randn(8, NUM_KV_HEADS * HEAD_SIZE, generator=gen)
    v = torch.randn(8, NUM_KV_HEADS * HEAD_SIZE, generator=gen)
    with set_forward_context({"enc.attn": md}, vllm_config):
        out = layer(q, k, v).view(8, NUM_HEADS, HEAD_SIZE)
    shaped = (q.view(8, NUM_HEADS, HEAD_SIZE), k.view(8, NUM_KV_HEADS, -1), v.view(8, 2, -1))
    for s, e in ((0, 6), (6, 8)):
        ref = _dense(*(t[s:e] for t in shaped), 0.25)
        torch.testing.assert_close(out[s:e].double(), ref, atol=1e-5, rtol=1e-5)


def test_decoder_groups_keep_their_tensors():
    """A decoder group next to the encoder-only one is allocated as before."""
    vllm_config = VllmConfig(cache_config=CacheConfig(block_size=16))
    spec = FullAttentionSpec(
        block_size=16, num_kv_heads=NUM_KV_HEADS, head_size=HEAD_SIZE, dtype=torch.float32
    )
    with set_current_vllm_config(vllm_config):
        from vllm.model_executor.layers.attention import Attention

        Attention(NUM_HEADS, HEAD_SIZE, 0.25, num_kv_heads=NUM_KV_HEADS, prefix="dec.attn")
        EncoderOnlyAttention(NUM_HEADS, HEAD_SIZE, 0.25, num_kv_heads=NUM_KV_HEADS, prefix="enc")
    from vllm.v1.kv_cache_interface import KVCacheTensor

    config = KVCacheConfig(
        num_blocks=4,
        kv_cache_tensors=[KVCacheTensor(size=4 * spec.page_size_bytes, shared_by=["dec.attn"])],
        kv_cache_groups=[KVCacheGroupSpec(["dec.attn"], spec)],
    )
    runner_config = kv_cache_setup.add_encoder_only_layers_to_kv_cache_config(config, vllm_config)
    assert [g.layer_names for g in runner_config.kv_cache_groups] == [["dec.attn"], ["enc"]]
    groups = kv_cache_setup.make_attn_groups(runner_config, vllm_config, torch.device("cpu"))
    caches = kv_cache_setup.allocate_and_bind_kv_caches(
        runner_config, groups, vllm_config, torch.device("cpu")
    )
    assert len(caches) == 1
    ctx = vllm_config.compilation_config.static_forward_context
    assert ctx["dec.attn"].kv_cache[0].shape == (2, 4, 16, NUM_KV_HEADS, HEAD_SIZE)
    assert ctx["enc"].kv_cache[0].numel() == 0


_TRITON_SCRIPT = r"""
import torch
from vllm.attention.layers.encoder_only_attention import create_encoder_only_attention_backend
from vllm.config import VllmConfig
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend, TritonAttentionImpl
from vllm.v1.kv_cache_interface import EncoderOnlyAttentionSpec

torch.manual_seed(0)
lengths, h, hkv, d, bs = [5, 1, 40, 17], 4, 2, 32, 16
n, pad = sum(lengths), 3
qsl = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
seq = torch.tensor(lengths, dtype=torch.int32)
cm = CommonAttentionMetadata(
    query_start_loc=qsl.to(DEVICE), query_start_loc_cpu=qsl, seq_lens=seq.to(DEVICE),
    seq_lens_cpu=seq, num_computed_tokens_cpu=torch.zeros_like(seq), num_reqs=4,
    num_actual_tokens=n, max_query_len=40, max_seq_len=40,
    block_table_tensor=torch.zeros(4, 1, dtype=torch.int32, device=DEVICE),
    slot_mapping=torch.full((n,), -1, dtype=torch.int64, device=DEVICE),
)
spec = EncoderOnlyAttentionSpec(block_size=bs, num_kv_heads=hkv, head_size=d, dtype=torch.float32)
backend = create_encoder_only_attention_backend(TritonAttentionBackend)
md = backend.get_builder_cls()(spec, ["l"], VllmConfig(), torch.device(DEVICE)).build(0, cm)
impl = TritonAttentionImpl(h, d, 0.2, hkv, attn_type="encoder_only")
q, k, v = (torch.randn(n + pad, x, d) for x in (h, hkv, hkv))
out = impl.forward(None, *(t.to(DEVICE) for t in (q, k, v)), torch.tensor([]), md,
                   output=torch.full((n + pad, h, d), 7.0, device=DEVICE)).cpu()
start = 0
for length in lengths:
    s, e = start, start + length
    kk = k[s:e].double().repeat_interleave(h // hkv, 1)
    vv = v[s:e].double().repeat_interleave(h // hkv, 1)
    p = (torch.einsum("qhd,khd->hqk", q[s:e].double(), kk) * 0.2).softmax(-1)
    ref = torch.einsum("hqk,khd->qhd", p, vv)
    torch.testing.assert_close(out[s:e].double(), ref, atol=1e-5, rtol=1e-5)
    start = e
assert bool((out[n:] == 0).all())
print("OK")
"""


def test_triton_backend_encoder_only_interpreter():
    """The Triton backend's encoder-only path (the unified kernel, non-causal,
    over the step's own K/V) under TRITON_INTERPRET=1, in a subprocess (the
    interpreter is chosen when triton is imported)."""
    import os
    import subprocess
    import sys

    triton = pytest.importorskip("triton")
    if tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 7):
        pytest.skip(f"triton {triton.__version__}'s interpreter cannot take runtime loop bounds")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    script = "DEVICE = 'cpu'\n" + _TRITON_SCRIPT
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OK" in proc.stdout
