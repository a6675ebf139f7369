"""The MLA backend (absorbed queries over cached latent rows) against plain
multi-head attention over keys and values expanded from the latents."""

from __future__ import annotations

import torch
from torch import nn

from vllm.config import VllmConfig
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends.mla.cpu_mla import CPUMLABackend
from vllm.v1.kv_cache_interface import MLAAttentionSpec

H, L, R, N, V, BS = 3, 12, 4, 6, 5, 4  # heads, latent, rope, nope, v head dims; block size


def _reference(q, kv_c, k_pe, w_uk, w_uv, num_computed, scale):
    """One request in float64: k = [W_UK c | k_pe], v = W_UV c per head."""
    k_nope = torch.einsum("hnl,sl->shn", w_uk.double(), kv_c.double())
    k = torch.cat((k_nope, k_pe.double()[:, None, :].expand(-1, H, -1)), dim=-1)
    v = torch.einsum("hvl,sl->shv", w_uv.double(), kv_c.double())
    scores = torch.einsum("qhd,shd->hqs", q.double(), k) * scale
    q_pos = torch.arange(num_computed, num_computed + q.shape[0])[:, None]
    scores.masked_fill_(torch.arange(k.shape[0])[None, :] > q_pos, float("-inf"))
    return torch.einsum("hqs,shv->qhv", scores.softmax(-1), v).reshape(q.shape[0], -1)


def test_mla_matches_expanded_attention_over_a_mixed_batch():
    torch.manual_seed(0)
    kv_b_proj = nn.Linear(L, H * (N + V), bias=False)
    w = kv_b_proj.weight.detach().view(H, N + V, L)
    w_uk, w_uv = w[:, :N], w[:, N:]
    spec = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=L + R, dtype=torch.float32)
    builder = CPUMLABackend.get_builder_cls()(spec, ["layer"], VllmConfig(), torch.device("cpu"))
    impl = CPUMLABackend.get_impl_cls()(
        H,
        L + R,
        0.3,
        1,
        None,
        None,
        "auto",
        q_lora_rank=None,
        kv_lora_rank=L,
        qk_nope_head_dim=N,
        qk_rope_head_dim=R,
        qk_head_dim=N + R,
        v_head_dim=V,
        kv_b_proj=kv_b_proj,
    )
    # (num_computed, query_len): a decode, then a chunk after a cached prefix.
    reqs, tables = [(9, 1), (6, 5)], torch.tensor([[3, 1, 5, 0], [2, 6, 4, 0]])
    kv_cache = torch.zeros(8, BS, L + R)
    history = [(torch.randn(n + q, L), torch.randn(n + q, R)) for n, q in reqs]
    for (n, _), (c, pe), table in zip(reqs, history, tables):  # the cached prefixes
        for pos in range(n):
            kv_cache[table[pos // BS], pos % BS] = torch.cat((c[pos], pe[pos]))
    qlens = torch.tensor([q for _, q in reqs], dtype=torch.int32)
    seq = torch.tensor([n + q for n, q in reqs], dtype=torch.int32)
    qsl = torch.cat((torch.zeros(1, dtype=torch.int32), qlens.cumsum(0).to(torch.int32)))
    slots = torch.stack(
        [
            table[pos // BS] * BS + pos % BS
            for (n, q), table in zip(reqs, tables)
            for pos in range(n, n + q)
        ]
    )
    cm = CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl,
        seq_lens=seq,
        seq_lens_cpu=seq,
        num_computed_tokens_cpu=seq - qlens,
        num_reqs=2,
        num_actual_tokens=int(qlens.sum()),
        max_query_len=5,
        max_seq_len=int(seq.max()),
        block_table_tensor=tables,
        slot_mapping=slots.to(torch.int64),
    )
    md = builder.build(common_prefix_len=0, common_attn_metadata=cm)
    q = torch.randn(int(qlens.sum()), H, N + R)
    new_c = torch.cat([c[n:] for (n, _), (c, _) in zip(reqs, history)])
    new_pe = torch.cat([pe[n:] for (n, _), (_, pe) in zip(reqs, history)])
    out = impl.forward(None, q, new_c, new_pe, kv_cache, md)
    for i, ((n, ql), (c, pe)) in enumerate(zip(reqs, history)):
        s = int(qsl[i])
        expected = _reference(q[s : s + ql], c, pe, w_uk, w_uv, n, 0.3)
        torch.testing.assert_close(out[s : s + ql].double(), expected, rtol=1e-4, atol=1e-5)
    # The new tokens' latent rows were written to their slots.
    flat = kv_cache.view(-1, L + R)
    torch.testing.assert_close(flat[slots], torch.cat((new_c, new_pe), dim=-1))
