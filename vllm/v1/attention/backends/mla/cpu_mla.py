"""Multi-head latent attention (MLA, DeepSeek-V2) over a paged latent cache,
in PyTorch (upstream: vllm/v1/attention/backends/mla/, the CPU MLA backend).

What is cached: per token one row [kv_c (kv_lora_rank L) | k_pe (rope dim R)]:
the compressed latent and the shared rotary key, not per-head K/V.

    kv_cache: (num_blocks, block_size, L + R); slot = block * block_size + offset

How attention reads it (the "absorbed" form). kv_b_proj maps a latent c to
per-head k_nope = W_UK[h] c and v = W_UV[h] c, with W_UK [H, N, L], W_UV
[H, V, L] (N = qk_nope_head_dim, V = v_head_dim). Because
    q_nope[h] . (W_UK[h] c) = (W_UK[h]^T q_nope[h]) . c,
each query head is first projected into latent space, q_lat = W_UK^T q_nope
[H, L], and scored against the cached rows directly:
    score[h, s] = [q_lat[h] | q_pe[h]] . [kv_c[s] | k_pe[s]] * scale,
the softmax-weighted sum of the cached latents gives o_lat [H, L], and
o[h] = W_UV[h] o_lat[h] [H, V]. Nothing per-head is ever materialised for
the cached tokens, which is the point of MLA.

The metadata is the CPU backend's (`CPUAttentionMetadataBuilder`): decodes
first, then prefills with their cached-prefix lengths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from vllm.utils import cdiv
from vllm.v1.attention.backend import AttentionBackend, AttentionImpl, AttentionType
from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadata, CPUAttentionMetadataBuilder

if TYPE_CHECKING:
    from torch import nn


class CPUMLABackend(AttentionBackend):
    accept_output_buffer = True

    @staticmethod
    def get_name() -> str:
        return "CPU_MLA"

    @staticmethod
    def get_impl_cls() -> type[CPUMLAImpl]:
        return CPUMLAImpl

    @staticmethod
    def get_builder_cls() -> type[CPUAttentionMetadataBuilder]:
        return CPUAttentionMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        cache_dtype_str: str = "auto",
    ) -> tuple[int, ...]:
        assert num_kv_heads == 1, "MLA caches one latent row per token"
        return (num_blocks, block_size, head_size)


class CPUMLAImpl(AttentionImpl[CPUAttentionMetadata]):
    """The per-layer MLA computation; `kv_b_proj` supplies W_UK and W_UV."""

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        *,
        q_lora_rank: int | None,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        qk_head_dim: int,
        v_head_dim: int,
        kv_b_proj: nn.Module,
    ) -> None:
        if (
            alibi_slopes is not None
            or sliding_window is not None
            or logits_soft_cap
            or attn_type != AttentionType.DECODER
            or kv_sharing_target_layer_name
        ):
            raise NotImplementedError("MLA supports plain causal decoder attention only.")
        if kv_cache_dtype != "auto":
            raise NotImplementedError(f"MLA kv_cache_dtype {kv_cache_dtype!r} is not built.")
        self.num_heads = num_heads
        self.head_size = head_size  # L + R, the cached row
        self.scale = float(scale)
        self.kv_lora_rank = kv_lora_rank
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        # Kept outside the module tree: the layer that owns it registers it.
        self._kv_b_proj = (kv_b_proj,)

    def _absorbed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_UK [H, N, L], W_UV [H, V, L]) as views of kv_b_proj's weight,
        whose rows are per head [k_nope (N rows); v (V rows)]."""
        weight = self._kv_b_proj[0].weight
        assert isinstance(weight, torch.Tensor)  # a linear layer's weight
        w = weight.view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        return w[:, : self.qk_nope_head_dim], w[:, self.qk_nope_head_dim :]

    def forward(
        self,
        layer: nn.Module,
        query: torch.Tensor,
        kv_c_normed: torch.Tensor,
        k_pe: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: CPUAttentionMetadata,
        output: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """query [T, H, N + R] (rope applied), kv_c_normed [T, L], k_pe [T, R],
        kv_cache (NB, BS, L + R) -> output [T, H * V]."""
        md = attn_metadata
        n = md.num_actual_tokens
        if output is None:
            output = torch.empty(
                query.shape[0],
                self.num_heads * self.v_head_dim,
                dtype=query.dtype,
                device=query.device,
            )
        output[n:].zero_()
        self._write_latents(kv_c_normed[:n], k_pe[:n], kv_cache, md)
        w_uk, w_uv = self._absorbed_weights()
        q_nope, q_pe = query[:n].split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        q_lat = torch.einsum("thn,hnl->thl", q_nope, w_uk)  # [n, H, L]
        q_full = torch.cat((q_lat, q_pe), dim=-1)  # [n, H, L + R]
        o_lat = torch.empty_like(q_lat)
        for start, end, num_computed, seq_len, row in _requests(md):
            o_lat[start:end] = self._attend(
                q_full[start:end], kv_cache, md, row, num_computed, seq_len
            )
        out = torch.einsum("thl,hvl->thv", o_lat, w_uv)  # [n, H, V]
        output[:n] = out.reshape(n, -1)
        return output

    @staticmethod
    def _write_latents(
        kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor, md: CPUAttentionMetadata
    ) -> None:
        rows = torch.cat((kv_c, k_pe), dim=-1)  # [n, L + R]
        if md.write_token_ids is not None:
            rows = rows.index_select(0, md.write_token_ids)
        kv_cache.view(-1, kv_cache.shape[-1]).index_copy_(0, md.slot_mapping, rows)

    def _attend(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        md: CPUAttentionMetadata,
        table_row: torch.Tensor,
        num_computed: int,
        seq_len: int,
    ) -> torch.Tensor:
        """One request: q [q_len, H, L + R] at positions num_computed.. over its
        seq_len cached rows -> o_lat [q_len, H, L]."""
        num_blocks = cdiv(seq_len, md.block_size)
        block_ids = table_row[:num_blocks]
        cached = kv_cache.index_select(0, block_ids).view(-1, kv_cache.shape[-1])[:seq_len]
        scores = torch.einsum("qhd,sd->hqs", q, cached).float() * self.scale
        q_len = q.shape[0]
        if q_len > 1:  # causal: query i sees keys 0 .. num_computed + i
            q_pos = torch.arange(num_computed, seq_len, device=q.device)[:, None]
            k_pos = torch.arange(seq_len, device=q.device)[None, :]
            scores.masked_fill_(k_pos > q_pos, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(cached.dtype)
        return torch.einsum("hqs,sl->qhl", probs, cached[:, : self.kv_lora_rank])


def _requests(md: CPUAttentionMetadata):
    """(query start, end, tokens cached before, seq_len, block-table row) per
    request: the decode rows (one query token each; a spec-as-decode request
    is several rows, see cpu_attn.py) then the prefills."""
    for i, seq_len in enumerate(md.decode_seq_lens_cpu.tolist()):
        yield i, i + 1, seq_len - 1, seq_len, md.decode_block_table[i]
    for p in md.prefills:
        yield p.query_start, p.query_end, p.num_computed, p.seq_len, md.block_table[p.req_index]
