"""The CPU paged-attention backend against dense per-request attention."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm.config import VllmConfig
from vllm.utils import cdiv
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends import cpu_attn
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
from vllm.v1.kv_cache_interface import FullAttentionSpec

NUM_KV_HEADS = 2
# (num_computed, query_len): decodes first, as the runner orders the batch.
MIXED_BATCH = [
    (37, 1),  # decode inside a block
    (15, 1),  # decode whose token opens a block (block_size 16)
    (63, 1),  # decode crossing a boundary at both block sizes
    (0, 1),  # one-token prompt
    (0, 23),  # fresh prefill
    (32, 17),  # chunk after a block-aligned cached prefix
    (45, 30),  # chunk after a ragged prefix, spanning several blocks
]


@pytest.fixture(params=["matmul", "sdpa"])
def prefill_path(request, monkeypatch):
    """Run each test through both prefill paths: the grouped matmul one (small
    requests) and SDPA (big ones), by moving the size threshold."""
    monkeypatch.setattr(cpu_attn, "_SDPA_MIN_SCORES", 0 if request.param == "sdpa" else 10**9)
    return request.param


def _reference(q, k, v, num_computed, scale, window, soft_cap):
    """Dense attention for one request in float64.
    q [Lq, H, D], k/v [L, Hkv, D] (whole sequence) -> [Lq, H, D]."""
    g = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(g, dim=1)
    v = v.double().repeat_interleave(g, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    if soft_cap is not None:
        scores = soft_cap * torch.tanh(scores / soft_cap)
    q_pos = torch.arange(q.shape[0])[:, None] + num_computed
    k_pos = torch.arange(k.shape[0])[None, :]
    allowed = k_pos <= q_pos
    if window is not None:
        allowed &= k_pos > q_pos - window
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


class _Batch:
    """Random requests with scattered blocks and their cached prefixes written."""

    def __init__(self, reqs, head_size, num_heads, block_size, num_pad_tokens=0, seed=0):
        gen = torch.Generator().manual_seed(seed)
        self.reqs, self.block_size = reqs, block_size
        seq_lens = [c + q for c, q in reqs]
        blocks_per_req = [cdiv(s, block_size) for s in seq_lens]
        num_blocks = sum(blocks_per_req) + 5
        perm = torch.randperm(num_blocks, generator=gen)  # non-contiguous blocks
        width = max(blocks_per_req) + 2
        self.block_table = torch.zeros(len(reqs), width, dtype=torch.int32)
        start = 0
        for i, n in enumerate(blocks_per_req):
            self.block_table[i, :n] = perm[start : start + n].to(torch.int32)
            start += n
        shape = CPUAttentionBackend.get_kv_cache_shape(
            num_blocks, block_size, NUM_KV_HEADS, head_size
        )
        self.kv_cache = torch.zeros(shape)
        rnd = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
        self.full_k = [rnd(s, NUM_KV_HEADS, head_size) for s in seq_lens]
        self.full_v = [rnd(s, NUM_KV_HEADS, head_size) for s in seq_lens]
        self.q = [rnd(q, num_heads, head_size) for _, q in reqs]
        for i, (c, _) in enumerate(reqs):  # prefixes from earlier steps
            slots = self.slots(i, 0, c)
            self.kv_cache[0].view(-1, NUM_KV_HEADS, head_size)[slots] = self.full_k[i][:c]
            self.kv_cache[1].view(-1, NUM_KV_HEADS, head_size)[slots] = self.full_v[i][:c]
        self.num_pad_tokens = num_pad_tokens

    def slots(self, i, start, end):
        pos = torch.arange(start, end)
        blocks = self.block_table[i, pos // self.block_size].to(torch.int64)
        return blocks * self.block_size + pos % self.block_size

    def step_inputs(self):
        """(query, key, value, CommonAttentionMetadata) for the new tokens."""
        q = torch.cat(self.q)
        k = torch.cat([fk[c:] for fk, (c, _) in zip(self.full_k, self.reqs)])
        v = torch.cat([fv[c:] for fv, (c, _) in zip(self.full_v, self.reqs)])
        slots = torch.cat([self.slots(i, c, c + n) for i, (c, n) in enumerate(self.reqs)])
        n_actual = q.shape[0]
        if self.num_pad_tokens:  # runner padding: garbage rows with slot -1
            pad = self.num_pad_tokens
            q = torch.cat([q, torch.randn(pad, *q.shape[1:])])
            k = torch.cat([k, torch.randn(pad, *k.shape[1:])])
            v = torch.cat([v, torch.randn(pad, *v.shape[1:])])
            slots = torch.cat([slots, torch.full((pad,), -1)])
        qlens = torch.tensor([n for _, n in self.reqs], dtype=torch.int32)
        qsl = torch.zeros(len(self.reqs) + 1, dtype=torch.int32)
        qsl[1:] = qlens.cumsum(0)
        seq = torch.tensor([c + n for c, n in self.reqs], dtype=torch.int32)
        cm = CommonAttentionMetadata(
            query_start_loc=qsl,
            query_start_loc_cpu=qsl,
            seq_lens=seq,
            seq_lens_cpu=seq,
            num_computed_tokens_cpu=seq - qlens,
            num_reqs=len(self.reqs),
            num_actual_tokens=n_actual,
            max_query_len=int(qlens.max()),
            max_seq_len=int(seq.max()),
            block_table_tensor=self.block_table,
            slot_mapping=slots,
        )
        return q, k, v, cm


def _run(batch, head_size, num_heads, window=None, soft_cap=None, vllm_config=None, md_out=None):
    spec = FullAttentionSpec(
        block_size=batch.block_size,
        num_kv_heads=NUM_KV_HEADS,
        head_size=head_size,
        dtype=torch.float32,
    )
    builder = CPUAttentionBackend.get_builder_cls()(
        spec, ["layer"], vllm_config or VllmConfig(), torch.device("cpu")
    )
    scale = head_size**-0.5
    impl = CPUAttentionBackend.get_impl_cls()(
        num_heads, head_size, scale, NUM_KV_HEADS, sliding_window=window, logits_soft_cap=soft_cap
    )
    q, k, v, cm = batch.step_inputs()
    md = builder.build(common_prefix_len=0, common_attn_metadata=cm)
    if md_out is not None:
        md_out.append(md)
    out = impl.forward(None, q, k, v, batch.kv_cache, md, output=torch.empty_like(q))
    return out, scale, cm


def _check(batch, out, scale, window, soft_cap):
    start = 0
    for i, (c, n) in enumerate(batch.reqs):
        ref = _reference(batch.q[i], batch.full_k[i], batch.full_v[i], c, scale, window, soft_cap)
        torch.testing.assert_close(out[start : start + n].double(), ref, atol=2e-5, rtol=1e-4)
        start += n
    assert torch.count_nonzero(out[start:]) == 0  # padding rows


def _check_cache_written(batch):
    d = batch.kv_cache.shape[-1]
    for i, (c, n) in enumerate(batch.reqs):
        slots = batch.slots(i, 0, c + n)
        torch.testing.assert_close(
            batch.kv_cache[0].view(-1, NUM_KV_HEADS, d)[slots], batch.full_k[i], atol=0, rtol=0
        )
        torch.testing.assert_close(
            batch.kv_cache[1].view(-1, NUM_KV_HEADS, d)[slots], batch.full_v[i], atol=0, rtol=0
        )


@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("gqa", [1, 2, 4])
@pytest.mark.parametrize("block_size", [16, 32])
def test_mixed_batch_matches_dense(head_size, gqa, block_size, prefill_path):
    num_heads = NUM_KV_HEADS * gqa
    batch = _Batch(MIXED_BATCH, head_size, num_heads, block_size, num_pad_tokens=3)
    out, scale, cm = _run(batch, head_size, num_heads)
    _check(batch, out, scale, None, None)
    _check_cache_written(batch)
    # Padding tokens (slot -1) wrote nothing: only the requests' slots changed.
    written = sum(c + n for c, n in batch.reqs)
    assert torch.count_nonzero(batch.kv_cache[0].abs().sum((-1, -2))) == written


@pytest.mark.parametrize("window", [None, 7, 20])
@pytest.mark.parametrize("soft_cap", [None, 5.0])
@pytest.mark.parametrize("gqa", [1, 4])
def test_sliding_window_and_soft_cap(window, soft_cap, gqa, prefill_path):
    num_heads = NUM_KV_HEADS * gqa
    batch = _Batch(MIXED_BATCH, 64, num_heads, 16, seed=1)
    out, scale, _ = _run(batch, 64, num_heads, window=window, soft_cap=soft_cap)
    _check(batch, out, scale, window, soft_cap)


@pytest.mark.parametrize(
    "reqs",
    [
        [(5, 1), (40, 1), (97, 1)],  # decode only
        [(0, 33), (0, 2)],  # fresh prefills only
        [(16, 16), (3, 50)],  # chunked prefills only
    ],
)
def test_uniform_batches(reqs, prefill_path):
    batch = _Batch(reqs, 64, 4, 16, seed=2)
    out, scale, _ = _run(batch, 64, 4)
    _check(batch, out, scale, None, None)
    _check_cache_written(batch)


def test_unordered_decode_after_prefill_is_still_correct(prefill_path):
    # A decode behind a prefill goes through the per-request path.
    reqs = [(0, 9), (30, 1), (12, 4)]
    batch = _Batch(reqs, 64, 4, 16, seed=3)
    out, scale, _ = _run(batch, 64, 4, window=10)
    _check(batch, out, scale, 10, None)


def test_kv_cache_shape_and_builder_contract():
    assert CPUAttentionBackend.get_name() == "CPU_ATTN"
    assert CPUAttentionBackend.get_kv_cache_shape(10, 16, 2, 64) == (2, 10, 16, 2, 64)
    assert CPUAttentionBackend.get_builder_cls().reorder_batch_threshold == 1
    with pytest.raises(NotImplementedError):
        CPUAttentionBackend.get_impl_cls()(4, 64, 0.1, 2, kv_cache_dtype="fp8")


def _spec_config(num_speculative_tokens):
    """A VllmConfig whose speculative_config asks for k drafts (only the field
    the builder reads: no model needed)."""
    config = VllmConfig()
    config.speculative_config = SimpleNamespace(  # type: ignore[assignment]
        num_speculative_tokens=num_speculative_tokens
    )
    return config


# Verify rows of 1 + k = 4 query tokens (drafts), short prompts / chunks of at
# most 4 tokens (attended as decode rows too), then real prefills.
SPEC_BATCH = [
    (37, 4),  # 3 drafts inside a block
    (14, 4),  # the drafts open a new block (block_size 16)
    (30, 1),  # no drafts this step
    (0, 3),  # a 3-token prompt: decode rows with num_computed 0
    (61, 2),  # 1 draft crossing a block boundary
    (0, 23),  # fresh prefill
    (45, 30),  # chunk after a ragged prefix
]


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("gqa", [1, 4])
def test_spec_as_decode_matches_dense(compiled, window, gqa, monkeypatch):
    """With speculation the builder keeps rows of up to 1 + k query tokens as
    decodes and expands each into one decode row per query token; every
    token's output must equal dense causal attention (and the torch decode
    path must agree with the compiled kernel)."""
    if compiled and not cpu_attn.ops.cpu_ops_available():
        pytest.skip("compiled CPU attention ops not built")
    monkeypatch.setattr(cpu_attn.ops, "cpu_ops_available", lambda: compiled)
    num_heads = NUM_KV_HEADS * gqa
    batch = _Batch(SPEC_BATCH, 64, num_heads, 16, num_pad_tokens=2, seed=4)
    mds: list = []
    out, scale, _ = _run(
        batch, 64, num_heads, window=window, vllm_config=_spec_config(3), md_out=mds
    )
    md = mds[0]
    # 5 requests of <= 4 tokens are decodes: 4 + 4 + 1 + 3 + 2 = 14 decode rows.
    assert (md.num_decodes, md.num_decode_tokens, md.num_prefills) == (5, 14, 2)
    assert md.decode_seq_lens_cpu.tolist() == [
        38, 39, 40, 41, 15, 16, 17, 18, 31, 1, 2, 3, 62, 63
    ]  # fmt: skip
    assert torch.equal(md.decode_block_table[4], md.block_table[1])
    _check(batch, out, scale, window, None)
    _check_cache_written(batch)


def test_spec_threshold_follows_num_speculative_tokens():
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float32)
    cls = CPUAttentionBackend.get_builder_cls()
    cpu = torch.device("cpu")
    assert cls(spec, ["l"], VllmConfig(), cpu).reorder_batch_threshold == 1
    assert cls(spec, ["l"], _spec_config(5), cpu).reorder_batch_threshold == 6
