"""Triton attention backend (upstream: vllm/v1/attention/backends/triton_attn.py).

Every request of a step, decode or prefill chunk, goes through one launch of
the unified paged-attention kernel (`vllm/v1/attention/ops/
triton_unified_attention.py`) over the block table. The KV cache layout is
the CPU backend's, (2, num_blocks, block_size, num_kv_heads, head_size), and
new K/V are written by slot (a Triton kernel that skips padding slots)
before attention reads them.

Full CUDA graphs (`AttentionCGSupport.ALWAYS`): nothing in `forward` waits
for the host, every launch's grid depends only on the padded token count, and
`build` returns tensors at fixed addresses for a given batch (slices of the
runner's persistent buffers, plus this builder's own `token_to_seq` buffer),
so a replay reads the current step's metadata. The runner pads a batch with
dummy requests whose slots are -1, so the kernels need no padding logic.
Runs wherever Triton has a driver (CUDA GPUs); on CPU it runs only under
TRITON_INTERPRET=1 (tests), so the selector never picks it there.

Encoder-only layers (their builder gets `causal=False`; no KV cache) run the
same kernel non-causally with the step's own K/V standing in for the cache:
K/V are copied into a buffer with one block of slack, viewed so that "block"
b starts at token b, and request i's table lists blocks qsl[i] + k *
block_size, so block k holds its tokens k * block_size onwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import AttentionSpec


class TritonAttentionBackend(AttentionBackend):
    accept_output_buffer = True

    @staticmethod
    def get_name() -> str:
        return "TRITON_ATTN"

    @staticmethod
    def get_impl_cls() -> type[TritonAttentionImpl]:
        return TritonAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[TritonAttentionMetadataBuilder]:
        return TritonAttentionMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        cache_dtype_str: str = "auto",
    ) -> tuple[int, ...]:
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return [32, 64, 80, 96, 112, 128, 160, 192, 224, 256]

    @classmethod
    def supports_dtype(cls, dtype: torch.dtype) -> bool:
        return dtype in (torch.float16, torch.bfloat16, torch.float32)


@dataclass
class TritonAttentionMetadata:
    num_actual_tokens: int
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32
    seq_lens: torch.Tensor  # [num_reqs] int32
    block_table: torch.Tensor  # [num_reqs, max_blocks] int32
    slot_mapping: torch.Tensor  # [num_actual_tokens] int64, < 0 = padding
    token_to_seq: torch.Tensor  # [num_actual_tokens] int32
    # False: encoder-only step (no cache; block_table indexes the step's tokens
    # in blocks of block_size).
    causal: bool = True
    block_size: int = 0


class TritonAttentionMetadataBuilder(AttentionMetadataBuilder[TritonAttentionMetadata]):
    # One kernel serves decodes and prefills in any order.
    reorder_batch_threshold: int | None = None
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.ALWAYS

    def __init__(
        self,
        kv_cache_spec: AttentionSpec,
        layer_names: list[str],
        vllm_config: VllmConfig,
        device: torch.device,
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        max_num_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        # Persistent: a CUDA graph replays with the address it captured.
        self.token_to_seq = torch.zeros(max_num_tokens, dtype=torch.int32, device=device)
        self.slot_mapping = torch.zeros(max_num_tokens, dtype=torch.int64, device=device)
        # Encoder-only steps: per request, the first token of each of its
        # blocks (made on the first such step; persistent for graphs).
        self.token_block_table: torch.Tensor | None = None

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> TritonAttentionMetadata:
        cm = common_attn_metadata
        qsl = cm.query_start_loc[: cm.num_reqs + 1]
        query_lens = qsl[1:] - qsl[:-1]
        n = cm.num_actual_tokens
        # output_size: no device -> host sync to size the result.
        token_to_seq = self.token_to_seq[:n]
        token_to_seq.copy_(
            torch.repeat_interleave(
                torch.arange(cm.num_reqs, dtype=torch.int32, device=qsl.device),
                query_lens,
                output_size=n,
            )
        )
        if not cm.causal:
            return self._build_non_causal(cm, token_to_seq)
        slot_mapping = cm.slot_mapping[:n]
        if slot_mapping.dtype != torch.int64:
            slot_mapping = self.slot_mapping[:n]
            slot_mapping.copy_(cm.slot_mapping[:n])
        return TritonAttentionMetadata(
            num_actual_tokens=n,
            query_start_loc=qsl,
            seq_lens=cm.seq_lens[: cm.num_reqs],
            block_table=cm.block_table_tensor[: cm.num_reqs],
            slot_mapping=slot_mapping,
            token_to_seq=token_to_seq,
        )

    def _build_non_causal(
        self, cm: CommonAttentionMetadata, token_to_seq: torch.Tensor
    ) -> TritonAttentionMetadata:
        """Encoder-only step: each request's whole sequence, no cache."""
        q_lens = cm.query_start_loc_cpu[1 : cm.num_reqs + 1] - cm.query_start_loc_cpu[: cm.num_reqs]
        if not torch.equal(q_lens.to(torch.int32), cm.seq_lens_cpu[: cm.num_reqs].to(torch.int32)):
            raise ValueError(
                "Encoder-only attention needs each request's whole sequence in one step "
                "(chunked prefill and prefix caching must be off for this model)."
            )
        block_size = self.kv_cache_spec.block_size
        if self.token_block_table is None:
            self.token_block_table = torch.zeros(
                self.vllm_config.scheduler_config.max_num_seqs,
                -(-self.slot_mapping.shape[0] // block_size),
                dtype=torch.int32,
                device=self.device,
            )
        table = self.token_block_table[: cm.num_reqs]
        blocks = torch.arange(table.shape[1], dtype=torch.int32, device=table.device)
        torch.add(
            cm.query_start_loc[: cm.num_reqs, None].to(torch.int32),
            blocks[None, :] * block_size,
            out=table,
        )
        n = cm.num_actual_tokens
        return TritonAttentionMetadata(
            num_actual_tokens=n,
            query_start_loc=cm.query_start_loc[: cm.num_reqs + 1],
            seq_lens=cm.seq_lens[: cm.num_reqs],
            block_table=table,
            slot_mapping=self.slot_mapping[:0],
            token_to_seq=token_to_seq,
            causal=False,
            block_size=block_size,
        )


class TritonAttentionImpl(AttentionImpl[TritonAttentionMetadata]):
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes: list[float] | None = None,
        sliding_window: int | None = None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
    ) -> None:
        if attn_type not in (AttentionType.DECODER, AttentionType.ENCODER_ONLY):
            raise NotImplementedError(f"TRITON_ATTN: attn_type {attn_type!r} is not built.")
        if attn_type == AttentionType.ENCODER_ONLY and sliding_window is not None:
            raise NotImplementedError("TRITON_ATTN: encoder-only sliding windows are not built.")
        self.attn_type = attn_type
        if alibi_slopes is not None or kv_cache_dtype != "auto":
            raise NotImplementedError("TRITON_ATTN: ALiBi and quantized KV caches are not built.")
        if kv_sharing_target_layer_name is not None:
            raise NotImplementedError("TRITON_ATTN: KV sharing between layers is not built.")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        if num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads {num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}."
            )
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap or None

    def forward(
        self,
        layer: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: TritonAttentionMetadata,
        output: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """query [T, H, D], key/value [T, Hkv, D] -> output [T, H, D]
        (rows past num_actual_tokens are zero)."""
        from vllm.v1.attention.ops.triton_reshape_and_cache_flash import (
            triton_reshape_and_cache_flash,
        )
        from vllm.v1.attention.ops.triton_unified_attention import unified_attention

        md = attn_metadata
        if output is None:
            output = torch.empty_like(query)
        n = md.num_actual_tokens
        if n < query.shape[0]:
            output[n:].zero_()
        if (self.attn_type == AttentionType.ENCODER_ONLY) != (not md.causal):
            raise ValueError(
                "TRITON_ATTN: an encoder-only layer got causal metadata, or a decoder layer "
                "non-causal metadata (the layer and its builder disagree)."
            )
        if not md.causal:
            self._encoder_only(query[:n], key[:n], value[:n], md, output[:n])
            return output
        key_cache, value_cache = kv_cache.unbind(0)
        triton_reshape_and_cache_flash(key[:n], value[:n], key_cache, value_cache, md.slot_mapping)
        unified_attention(
            output[:n],
            query[:n],
            key_cache,
            value_cache,
            md.block_table,
            md.seq_lens,
            md.query_start_loc,
            md.token_to_seq,
            self.scale,
            self.sliding_window,
            self.logits_soft_cap,
        )
        return output

    def _encoder_only(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        md: TritonAttentionMetadata,
        output: torch.Tensor,
    ) -> None:
        """The step's K/V as a stand-in cache: a copy with one block of slack
        (the kernel reads whole blocks), viewed [n, block_size, Hkv, D] with
        block b starting at token b."""
        from vllm.v1.attention.ops.triton_unified_attention import unified_attention

        n, bs = query.shape[0], md.block_size
        views = []
        for t in (key, value):
            buf = t.new_zeros(n + bs, self.num_kv_heads, self.head_size)
            buf[:n] = t
            s0, s1, s2 = buf.stride()
            shape = (n, bs, self.num_kv_heads, self.head_size)
            views.append(buf.as_strided(shape, (s0, s0, s1, s2)))
        unified_attention(
            output,
            query,
            views[0],
            views[1],
            md.block_table,
            md.seq_lens,
            md.query_start_loc,
            md.token_to_seq,
            self.scale,
            None,
            self.logits_soft_cap,
            causal=False,
        )
