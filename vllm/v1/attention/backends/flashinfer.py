"""FlashInfer attention backend, GPU only and optional
(upstream: vllm/v1/attention/backends/flashinfer.py).

KV cache layout, one tensor per layer, FlashInfer's "NHD" paged layout:

    kv_cache: (num_blocks, 2, block_size, num_kv_heads, head_size)
              kv_cache[:, 0] = keys, kv_cache[:, 1] = values

so one block's keys and values are adjacent (unlike CPU_ATTN / TRITON_ATTN,
whose leading dim is K/V). A token's slot is `block * block_size + offset`.

FlashInfer describes each request's pages in CSR form:
- `paged_kv_indptr` [B + 1]: request i owns `indices[indptr[i]:indptr[i + 1]]`;
- `paged_kv_indices`: the block ids, the first cdiv(seq_len, block_size)
  entries of each block-table row, back to back;
- `paged_kv_last_page_len` [B]: tokens used in the last page, 1..block_size.
`compute_paged_kv_metadata` builds these in plain torch (tested on CPU).

The batch arrives decodes first (`reorder_batch_threshold = 1`): decodes go
through `BatchDecodeWithPagedKVCacheWrapper`, the rest (prefills and chunked
prefills, causal aligned to the end of each request's keys) through
`BatchPrefillWithPagedKVCacheWrapper`. A wrapper is planned (`plan`, host
work) once per step for each set of layer hyper-parameters (heads, window,
soft-cap, scale) and then `run` by every layer that shares them.

`flashinfer` is imported only when a wrapper is first built, so this module
imports (and its pure-torch parts run) without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)
from vllm.v1.attention.backends.utils import split_decodes_and_prefills

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import AttentionSpec

# FlashInfer keeps split-k partial results here; shared by every wrapper of a
# builder (they run one after the other on one stream). 128 MiB is the size
# FlashInfer's documentation recommends; upstream vLLM uses a few hundred MiB.
FLASHINFER_WORKSPACE_BUFFER_SIZE = 256 * 1024 * 1024


class FlashInferBackend(AttentionBackend):
    accept_output_buffer = True

    @staticmethod
    def get_name() -> str:
        return "FLASHINFER"

    @staticmethod
    def get_impl_cls() -> type[FlashInferImpl]:
        return FlashInferImpl

    @staticmethod
    def get_builder_cls() -> type[FlashInferMetadataBuilder]:
        return FlashInferMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        cache_dtype_str: str = "auto",
    ) -> tuple[int, ...]:
        return (num_blocks, 2, block_size, num_kv_heads, head_size)

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        # The head dims FlashInfer ships prebuilt kernels for (upstream's list).
        return [64, 128, 256]

    @classmethod
    def supports_dtype(cls, dtype: torch.dtype) -> bool:
        return dtype in (torch.float16, torch.bfloat16)


@dataclass
class PagedKVMetadata:
    """FlashInfer's CSR description of some requests' pages."""

    indptr: torch.Tensor  # [B + 1] int32, host
    indices: torch.Tensor  # [indptr[-1]] int32, on the block table's device
    last_page_len: torch.Tensor  # [B] int32, host, in 1..block_size


def compute_paged_kv_metadata(
    block_table: torch.Tensor, seq_lens_cpu: torch.Tensor, block_size: int
) -> PagedKVMetadata:
    """block_table [B, max_blocks] (any int dtype, any device), seq_lens_cpu [B]
    (host) -> CSR page metadata.

    Request i uses pages block_table[i, :cdiv(seq_lens[i], block_size)]. The
    total page count is known on the host, so the indices are gathered
    without a device -> host sync: token j of the flat list belongs to request
    r = repeat_interleave(arange(B), pages)[j], column j - indptr[r].
    """
    if block_table.dim() != 2 or block_table.shape[0] != seq_lens_cpu.shape[0]:
        raise ValueError(
            f"block_table {tuple(block_table.shape)} does not match "
            f"seq_lens {tuple(seq_lens_cpu.shape)}."
        )
    seq_lens = seq_lens_cpu.to(torch.int64)
    if bool((seq_lens <= 0).any()):
        raise ValueError("Every request needs at least one key (seq_len >= 1).")
    pages = (seq_lens + block_size - 1) // block_size
    if bool((pages > block_table.shape[1]).any()):
        raise ValueError(
            f"A request needs more than the block table's {block_table.shape[1]} blocks."
        )
    indptr = torch.zeros(len(seq_lens) + 1, dtype=torch.int64)
    torch.cumsum(pages, 0, out=indptr[1:])
    total = int(indptr[-1])
    # seq_len % block_size, with a full last page reported as block_size.
    last_page_len = (seq_lens - 1) % block_size + 1
    device = block_table.device
    rows = torch.repeat_interleave(
        torch.arange(len(seq_lens), device=device), pages.to(device), output_size=total
    )
    cols = torch.arange(total, device=device) - indptr.to(device)[:-1].index_select(0, rows)
    indices = block_table[rows, cols].to(torch.int32)
    return PagedKVMetadata(indptr.to(torch.int32), indices, last_page_len.to(torch.int32))


def kv_write_rows(slot_mapping: torch.Tensor, block_size: int) -> torch.Tensor:
    """Slots -> rows of the cache viewed as [num_blocks * 2 * block_size, Hkv, D]
    for the keys (the value row is the key row + block_size)."""
    return (slot_mapping // block_size) * (2 * block_size) + slot_mapping % block_size


def write_to_paged_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    key_rows: torch.Tensor,
    token_ids: torch.Tensor | None,
) -> None:
    """Scatter key/value [T, Hkv, D] (rows `token_ids`, or all when None) into
    kv_cache (NB, 2, BS, Hkv, D) at `key_rows` (see `kv_write_rows`)."""
    if token_ids is not None:
        key = key.index_select(0, token_ids)
        value = value.index_select(0, token_ids)
    block_size = kv_cache.shape[2]
    flat = kv_cache.view(-1, *kv_cache.shape[3:])  # row = (block * 2 + kv) * BS + offset
    flat.index_copy_(0, key_rows, key)
    flat.index_copy_(0, key_rows + block_size, value)


@dataclass(frozen=True)
class _PlanKey:
    """What a plan depends on beyond the step's pages: layers that agree on
    all of it share one planned wrapper."""

    num_heads: int
    num_kv_heads: int
    head_size: int
    window_left: int  # -1 = no window
    logits_soft_cap: float  # 0 = none
    scale: float
    q_dtype: torch.dtype
    kv_dtype: torch.dtype


@dataclass
class FlashInferMetadata:
    num_actual_tokens: int
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    block_size: int
    # KV write targets (see `kv_write_rows`); token ids None = all tokens written.
    key_rows: torch.Tensor
    write_token_ids: torch.Tensor | None
    decode_kv: PagedKVMetadata | None
    prefill_kv: PagedKVMetadata | None
    prefill_qo_indptr: torch.Tensor | None  # [num_prefills + 1] int32, host
    builder: FlashInferMetadataBuilder
    _planned: dict[tuple[str, _PlanKey], Any] = field(default_factory=dict)

    def wrapper(self, kind: str, key: _PlanKey) -> Any:
        """The `kind` ("decode" / "prefill") wrapper planned for `key` this step."""
        wrapper = self._planned.get((kind, key))
        if wrapper is None:
            wrapper = self.builder.plan(kind, key, self)
            self._planned[(kind, key)] = wrapper
        return wrapper


class FlashInferMetadataBuilder(AttentionMetadataBuilder[FlashInferMetadata]):
    reorder_batch_threshold: int | None = 1

    def __init__(
        self,
        kv_cache_spec: AttentionSpec,
        layer_names: list[str],
        vllm_config: VllmConfig,
        device: torch.device,
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size
        self._workspace: torch.Tensor | None = None
        self._wrappers: dict[tuple[str, _PlanKey], Any] = {}

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> FlashInferMetadata:
        cm = common_attn_metadata
        if not cm.causal:
            raise NotImplementedError("FLASHINFER supports causal attention only.")
        num_decodes, num_prefills, num_decode_tokens, _ = split_decodes_and_prefills(
            cm, decode_threshold=self.reorder_batch_threshold or 1
        )
        block_table = cm.block_table_tensor[: cm.num_reqs]
        seq_lens_cpu = cm.seq_lens_cpu[: cm.num_reqs]
        decode_kv = prefill_kv = qo_indptr = None
        if num_decodes:
            decode_kv = compute_paged_kv_metadata(
                block_table[:num_decodes], seq_lens_cpu[:num_decodes], self.block_size
            )
        if num_prefills:
            prefill_kv = compute_paged_kv_metadata(
                block_table[num_decodes:], seq_lens_cpu[num_decodes:], self.block_size
            )
            qsl = cm.query_start_loc_cpu[num_decodes : cm.num_reqs + 1]
            qo_indptr = (qsl - qsl[0]).to(torch.int32)
        slots = cm.slot_mapping[: cm.num_actual_tokens].to(torch.int64)
        token_ids = None
        if not bool((slots >= 0).all()):  # padding rows (slot < 0) are not written
            token_ids = (slots >= 0).nonzero().squeeze(1)
            slots = slots.index_select(0, token_ids)
        return FlashInferMetadata(
            num_actual_tokens=cm.num_actual_tokens,
            num_decodes=num_decodes,
            num_decode_tokens=num_decode_tokens,
            num_prefills=num_prefills,
            block_size=self.block_size,
            key_rows=kv_write_rows(slots, self.block_size),
            write_token_ids=token_ids,
            decode_kv=decode_kv,
            prefill_kv=prefill_kv,
            prefill_qo_indptr=qo_indptr,
            builder=self,
        )

    def _get_wrapper(self, kind: str, key: _PlanKey) -> Any:
        wrapper = self._wrappers.get((kind, key))
        if wrapper is not None:
            return wrapper
        import flashinfer  # optional dependency: imported only when used

        if self._workspace is None:
            self._workspace = torch.zeros(
                FLASHINFER_WORKSPACE_BUFFER_SIZE, dtype=torch.uint8, device=self.device
            )
        if kind == "decode":
            # Tensor-core decode pays off for large GQA groups (upstream's rule).
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self._workspace, "NHD", use_tensor_cores=key.num_heads // key.num_kv_heads > 4
            )
        else:
            wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")
        self._wrappers[(kind, key)] = wrapper
        return wrapper

    def plan(self, kind: str, key: _PlanKey, md: FlashInferMetadata) -> Any:
        """Plan this builder's `kind` wrapper for `key` over the step's pages."""
        wrapper = self._get_wrapper(kind, key)
        common = dict(
            window_left=key.window_left,
            logits_soft_cap=key.logits_soft_cap,
            sm_scale=key.scale,
            q_data_type=key.q_dtype,
            kv_data_type=key.kv_dtype,
        )
        if kind == "decode":
            kv = md.decode_kv
            assert kv is not None
            wrapper.plan(
                kv.indptr,
                kv.indices,
                kv.last_page_len,
                key.num_heads,
                key.num_kv_heads,
                key.head_size,
                self.block_size,
                pos_encoding_mode="NONE",
                **common,
            )
        else:
            kv = md.prefill_kv
            assert kv is not None and md.prefill_qo_indptr is not None
            wrapper.plan(
                md.prefill_qo_indptr,
                kv.indptr,
                kv.indices,
                kv.last_page_len,
                key.num_heads,
                key.num_kv_heads,
                key.head_size,
                self.block_size,
                causal=True,
                **common,
            )
        return wrapper


class FlashInferImpl(AttentionImpl[FlashInferMetadata]):
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
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"FLASHINFER: attn_type {attn_type!r} is not built.")
        if alibi_slopes is not None:
            raise NotImplementedError("FLASHINFER: ALiBi is not built.")
        if kv_cache_dtype != "auto":
            raise NotImplementedError(
                f"FLASHINFER: kv_cache_dtype {kv_cache_dtype!r} is not built (use 'auto')."
            )
        if kv_sharing_target_layer_name is not None:
            raise NotImplementedError("FLASHINFER: KV sharing between layers is not built.")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        if num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads {num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}."
            )
        self.sliding_window = sliding_window
        # FlashInfer's window_left counts the keys left of the query, the
        # query itself excluded: a window of w tokens is window_left = w - 1.
        self.window_left = sliding_window - 1 if sliding_window else -1
        self.logits_soft_cap = float(logits_soft_cap) if logits_soft_cap else 0.0

    def _plan_key(self, query: torch.Tensor, kv_cache: torch.Tensor) -> _PlanKey:
        return _PlanKey(
            self.num_heads,
            self.num_kv_heads,
            self.head_size,
            self.window_left,
            self.logits_soft_cap,
            self.scale,
            query.dtype,
            kv_cache.dtype,
        )

    def forward(
        self,
        layer: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: FlashInferMetadata,
        output: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """query [T, H, D], key/value [T, Hkv, D], kv_cache (NB, 2, BS, Hkv, D)
        -> output [T, H, D]; rows past `num_actual_tokens` are zero."""
        md = attn_metadata
        if output is None:
            output = torch.empty_like(query)
        n = md.num_actual_tokens
        if n < query.shape[0]:
            output[n:].zero_()
        write_to_paged_kv_cache(key[:n], value[:n], kv_cache, md.key_rows, md.write_token_ids)
        plan_key = self._plan_key(query, kv_cache)
        nd = md.num_decode_tokens
        if md.num_decodes:
            md.wrapper("decode", plan_key).run(query[:nd].contiguous(), kv_cache, out=output[:nd])
        if md.num_prefills:
            md.wrapper("prefill", plan_key).run(
                query[nd:n].contiguous(), kv_cache, out=output[nd:n]
            )
        return output
