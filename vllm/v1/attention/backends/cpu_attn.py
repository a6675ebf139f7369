"""Paged attention in PyTorch, the CPU backend (upstream: vllm/v1/attention/backends/cpu_attn.py).

KV cache layout, one tensor per layer:

    kv_cache: (2, num_blocks, block_size, num_kv_heads, head_size)
              kv_cache[0] = keys, kv_cache[1] = values

A token's slot is `block_id * block_size + offset`; flattening the two block
dims gives a `[num_slots, num_kv_heads, head_size]` view in which the slot is
the row index. New K/V are written by `slot_mapping` (negative slot = padding,
not written), and attention reads K/V only through the block table.

The batch arrives decodes first (`reorder_batch_threshold = 1`, or 1 + k
with k speculative tokens: see "spec-as-decode" below):
- decodes (query length 1) are one batched computation: the blocks of every
  decode request are gathered with one `index_select` into a head-major
  [B, Hkv, L, D] copy, keys beyond a request's length (or outside its sliding
  window) get a -inf bias, and grouped-query attention runs without repeating
  K/V: the G query heads of a KV head are the rows of one [G, D] x [D, L]
  product. (SDPA in bf16 on CPU was ~10x slower for this shape.)
- prefills / chunked prefills are computed request by request with the causal
  offset: query i of a request with `c` cached tokens sees keys 0..c+i. A
  request without cached prefix attends over its new K/V directly; otherwise
  its keys are gathered through the block table. Big requests use SDPA
  (flash-style), small ones the grouped matmul path.

Spec-as-decode: a request verifying k drafts has a query of 1 + k tokens,
which the prefill path would attend request by request (gather + matmul per
layer: measured ~2.5x the cost of the same queries as decode rows at 900
context tokens). Its query tokens are always the last q of its sequence, so
query i (0-based) sees exactly keys 0 .. seq_len - q + i: the builder expands
such a request into q decode rows, each with the request's block-table row
and seq_len - q + 1 + i as its length, and the decode kernel attends them
like single-token decodes. The same holds for a short prompt (chunk) of at
most 1 + k tokens, which is then also attended as decode rows.

Everything the layers of one step share (gather indices, masks) is built once
per step and sliding window, not once per layer.

Encoder-only layers (`AttentionType.ENCODER_ONLY`, BERT-style models; their
builder gets `causal=False`, see vllm/attention/layers/encoder_only_attention.py)
have no KV cache: every request of the step is its whole sequence, each query
sees all keys of its own request, and nothing is written or read through the
block table. Requests of similar length are padded into buckets, one SDPA
call each (cpu_encoder_attn.py); a request alone in its bucket is attended
in place.

When the compiled ops (vllm._C, csrc/cpu) are loaded, decodes skip the gather
entirely: `paged_attention_decode` reads K/V in place through the block
table (one task per sequence x kv head, online softmax in fp32; 4-9x faster
than gather + matmuls at batch 64), and new K/V are written by
`reshape_and_cache`. The torch paths above stay as the fallback.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from vllm import _custom_ops as ops
from vllm.utils import cdiv
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)
from vllm.v1.attention.backends.cpu_encoder_attn import (
    EncoderBucket,
    bucketed_attention,
    plan_buckets,
)
from vllm.v1.attention.backends.utils import split_decodes_and_prefills

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import AttentionSpec


class CPUAttentionBackend(AttentionBackend):
    accept_output_buffer = True

    @staticmethod
    def get_name() -> str:
        return "CPU_ATTN"

    @staticmethod
    def get_impl_cls() -> type[CPUAttentionBackendImpl]:
        return CPUAttentionBackendImpl

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
        return (2, num_blocks, block_size, num_kv_heads, head_size)


@dataclass
class PrefillRequest:
    """One prefill (or chunked-prefill) request of the step, host-side ints."""

    query_start: int  # first token of the request in the flattened batch
    query_end: int
    num_computed: int  # tokens already in the cache before this step
    seq_len: int  # num_computed + query length
    req_index: int  # row in the block table


@dataclass
class DecodePlan:
    """What every layer with a given sliding window needs for the decode part."""

    block_ids: torch.Tensor  # [num_decodes * blocks_per_req] int64, flattened
    blocks_per_req: int
    # [num_decodes, 1, 1, 1, blocks_per_req * block_size] float32: 0 for keys the
    # query sees, -inf for keys past its length or outside its window.
    key_bias: torch.Tensor


@dataclass
class PrefillPlan:
    """One prefill request's gather indices and mask for a given sliding window."""

    block_ids: torch.Tensor | None  # blocks to gather; None = use the new K/V as is
    key_start: int  # absolute position of the first gathered key
    # Big requests go through SDPA (flash-style, never materialises the scores);
    # small ones through the grouped matmul path, which is faster there.
    use_sdpa: bool
    # SDPA: [q_len, k_len] bool, True = attend; None = plain causal (q_len == k_len).
    mask: torch.Tensor | None
    # Matmul path: [q_len, k_len] bool, True = masked out.
    masked_out: torch.Tensor | None


@dataclass
class CPUAttentionMetadata:
    num_actual_tokens: int
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    block_size: int
    # Where to write the new K/V: slots and the token rows they come from
    # (`write_token_ids` is None when every token of the step is written).
    slot_mapping: torch.Tensor  # [num_written] int64
    write_token_ids: torch.Tensor | None
    # One decode row per decode query token (num_decode_tokens rows; more than
    # num_decodes when spec-as-decode expanded multi-token decodes): the row's
    # key count and its request's block-table row.
    decode_seq_lens: torch.Tensor  # [num_decode_tokens] int64
    decode_seq_lens_cpu: torch.Tensor  # [num_decode_tokens] int64
    decode_block_table: torch.Tensor  # [num_decode_tokens, max_blocks] int64
    # The step's slots including padding (< 0), for the compiled cache write.
    all_slots: torch.Tensor  # [num_actual_tokens] int64
    block_table: torch.Tensor  # [num_reqs, max_blocks] int64
    prefills: list[PrefillRequest]
    # False: encoder-only step (bidirectional within each request, no cache).
    causal: bool = True
    # Per-step caches keyed by sliding window, shared by all layers.
    _decode_plans: dict[int | None, DecodePlan] = field(default_factory=dict)
    _prefill_plans: dict[int | None, list[PrefillPlan]] = field(default_factory=dict)
    _encoder_plan: tuple[list[int], list[EncoderBucket]] | None = None

    def encoder_plan(self) -> tuple[list[int], list[EncoderBucket]]:
        """Encoder-only steps: (requests attended alone, padded buckets of the
        rest), see cpu_encoder_attn.py; built once per step."""
        if self._encoder_plan is None:
            starts = [r.query_start for r in self.prefills]
            lengths = [r.query_end - r.query_start for r in self.prefills]
            self._encoder_plan = plan_buckets(starts, lengths, self.block_table.device)
        return self._encoder_plan

    def decode_plan(self, sliding_window: int | None) -> DecodePlan:
        plan = self._decode_plans.get(sliding_window)
        if plan is None:
            plan = _make_decode_plan(self, sliding_window)
            self._decode_plans[sliding_window] = plan
        return plan

    def prefill_plans(self, sliding_window: int | None) -> list[PrefillPlan]:
        plans = self._prefill_plans.get(sliding_window)
        if plans is None:
            plans = [_make_prefill_plan(self, r, sliding_window) for r in self.prefills]
            self._prefill_plans[sliding_window] = plans
        return plans


def _make_decode_plan(md: CPUAttentionMetadata, window: int | None) -> DecodePlan:
    """Gather indices and key mask for the decode requests.

    Without a window a request needs blocks 0..cdiv(seq_len)-1. With a window
    of w tokens the single query (position seq_len-1) sees keys >= seq_len-w,
    so only blocks from (seq_len-w)//block_size on are gathered.
    """
    bs = md.block_size
    seq_cpu = md.decode_seq_lens_cpu
    first_key_cpu = (seq_cpu - window).clamp_(min=0) if window is not None else None
    first_blk_cpu = first_key_cpu // bs if first_key_cpu is not None else torch.zeros_like(seq_cpu)
    last_blk_cpu = (seq_cpu - 1) // bs
    blocks_per_req = int((last_blk_cpu - first_blk_cpu).max().item()) + 1
    device = md.block_table.device
    cols = torch.arange(blocks_per_req, device=device)
    first_blk = first_blk_cpu.to(device)
    # Columns past a request's last block are clamped into the table and masked.
    col_idx = (first_blk[:, None] + cols[None, :]).clamp_(max=md.block_table.shape[1] - 1)
    block_ids = md.decode_block_table.gather(1, col_idx).reshape(-1)
    pos = first_blk[:, None] * bs + torch.arange(blocks_per_req * bs, device=device)[None, :]
    seq = md.decode_seq_lens[:, None]
    key_mask = pos < seq
    if window is not None:
        key_mask &= pos >= seq - window
    key_bias = torch.zeros(key_mask.shape, dtype=torch.float32, device=device)
    key_bias.masked_fill_(~key_mask, float("-inf"))
    return DecodePlan(block_ids, blocks_per_req, key_bias.view(len(seq), 1, 1, 1, -1))


# Above this many query x key pairs per head a prefill uses SDPA, below it the
# grouped matmul path (measured crossover on a 2-core AVX-512 CPU: ~256 x 256).
_SDPA_MIN_SCORES = 256 * 256


def _make_prefill_plan(
    md: CPUAttentionMetadata, req: PrefillRequest, window: int | None
) -> PrefillPlan:
    """Keys needed by one prefill request and its causal (+window) mask.

    Query i sits at absolute position num_computed + i and sees keys at
    positions p with p <= num_computed + i (and p > num_computed + i - window).
    """
    device = md.block_table.device
    if req.num_computed == 0:
        block_ids, key_start = None, 0
    else:
        first_key = max(0, req.num_computed - window + 1) if window is not None else 0
        first_blk = first_key // md.block_size
        last_blk = cdiv(req.seq_len, md.block_size)
        block_ids = md.block_table[req.req_index, first_blk:last_blk]
        key_start = first_blk * md.block_size
    q_len, k_len = req.query_end - req.query_start, req.seq_len - key_start
    use_sdpa = q_len * k_len > _SDPA_MIN_SCORES
    if use_sdpa and req.num_computed == 0 and window is None:
        return PrefillPlan(block_ids, key_start, True, None, None)
    q_pos = torch.arange(req.num_computed, req.seq_len, device=device)[:, None]
    k_pos = torch.arange(key_start, req.seq_len, device=device)[None, :]
    mask = k_pos <= q_pos
    if window is not None:
        mask &= k_pos > q_pos - window
    if use_sdpa:
        return PrefillPlan(block_ids, key_start, True, mask, None)
    return PrefillPlan(block_ids, key_start, False, None, ~mask)


class CPUAttentionMetadataBuilder(AttentionMetadataBuilder[CPUAttentionMetadata]):
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
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> CPUAttentionMetadata:
        cm = common_attn_metadata
        if not cm.causal:
            return self._build_non_causal(cm)
        num_decodes, num_prefills, num_decode_tokens, _ = split_decodes_and_prefills(
            cm, decode_threshold=self.reorder_batch_threshold or 1
        )
        slots, write_ids = self._write_targets(cm)
        seq_lens_cpu = cm.seq_lens_cpu[: cm.num_reqs].to(torch.int64)
        qsl = cm.query_start_loc_cpu.tolist()
        seq_list = seq_lens_cpu.tolist()
        prefills = [
            PrefillRequest(qsl[i], qsl[i + 1], seq_list[i] - (qsl[i + 1] - qsl[i]), seq_list[i], i)
            for i in range(num_decodes, cm.num_reqs)
        ]
        block_table = cm.block_table_tensor[: cm.num_reqs].to(torch.int64)
        decode_block_table = block_table[:num_decodes]
        decode_seq_lens = cm.seq_lens[:num_decodes].to(torch.int64)
        decode_seq_lens_cpu = seq_lens_cpu[:num_decodes]
        if num_decode_tokens > num_decodes:
            decode_block_table, decode_seq_lens_cpu = _expand_decode_rows(
                cm, num_decodes, num_decode_tokens, decode_block_table, decode_seq_lens_cpu
            )
            decode_seq_lens = decode_seq_lens_cpu.to(cm.seq_lens.device)
        return CPUAttentionMetadata(
            num_actual_tokens=cm.num_actual_tokens,
            num_decodes=num_decodes,
            num_decode_tokens=num_decode_tokens,
            num_prefills=num_prefills,
            block_size=self.block_size,
            slot_mapping=slots,
            write_token_ids=write_ids,
            all_slots=cm.slot_mapping[: cm.num_actual_tokens].to(torch.int64),
            decode_seq_lens=decode_seq_lens,
            decode_seq_lens_cpu=decode_seq_lens_cpu,
            decode_block_table=decode_block_table,
            block_table=block_table,
            prefills=prefills,
        )

    def _build_non_causal(self, cm: CommonAttentionMetadata) -> CPUAttentionMetadata:
        """Encoder-only step: every request is a prefill of its whole sequence
        (a one-token request too), attended bidirectionally; no cache writes."""
        qsl = cm.query_start_loc_cpu.tolist()
        seq_list = cm.seq_lens_cpu[: cm.num_reqs].tolist()
        prefills = []
        for i in range(cm.num_reqs):
            q_len = qsl[i + 1] - qsl[i]
            if seq_list[i] != q_len:
                raise ValueError(
                    f"Encoder-only attention needs each request's whole sequence in one "
                    f"step; request {i} has {seq_list[i] - q_len} tokens from earlier steps "
                    "(chunked prefill and prefix caching must be off for this model)."
                )
            prefills.append(PrefillRequest(qsl[i], qsl[i + 1], 0, q_len, i))
        empty = torch.zeros(0, dtype=torch.int64, device=cm.query_start_loc.device)
        return CPUAttentionMetadata(
            num_actual_tokens=cm.num_actual_tokens,
            num_decodes=0,
            num_decode_tokens=0,
            num_prefills=cm.num_reqs,
            block_size=self.block_size,
            slot_mapping=empty,
            write_token_ids=None,
            all_slots=empty,
            decode_seq_lens=empty,
            decode_seq_lens_cpu=empty.cpu(),
            decode_block_table=cm.block_table_tensor[:0].to(torch.int64),
            block_table=cm.block_table_tensor[: cm.num_reqs].to(torch.int64),
            prefills=prefills,
            causal=False,
        )

    @staticmethod
    def _write_targets(cm: CommonAttentionMetadata) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Slots to write and, when some tokens are padding (slot < 0), the rows to take."""
        slots = cm.slot_mapping[: cm.num_actual_tokens].to(torch.int64)
        valid = slots >= 0
        if bool(valid.all()):
            return slots, None
        write_ids = valid.nonzero().squeeze(1)
        return slots[write_ids], write_ids


def _expand_decode_rows(
    cm: CommonAttentionMetadata,
    num_decodes: int,
    num_decode_tokens: int,
    block_table: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Spec-as-decode (see the module docstring): decode request r with q_r
    query tokens -> q_r rows; row i of r gets r's block-table row and the
    key count seq_len_r - q_r + 1 + i. E.g. seq_lens [10, 7], q [3, 1] ->
    rows' lengths [8, 9, 10, 7]. Returns ([num_decode_tokens, max_blocks]
    block table, [num_decode_tokens] int64 lengths on the host)."""
    # numpy on the host: torch.repeat_interleave opens an OpenMP region, and
    # on a loaded 2-core host with 2 torch threads such a call on a dozen
    # elements was measured at ~6 ms (a thread waiting for its time slice).
    qsl = cm.query_start_loc_cpu[: num_decodes + 1].numpy().astype(np.int64)
    q_lens = qsl[1:] - qsl[:-1]  # [num_decodes]
    row_req = np.repeat(np.arange(num_decodes), q_lens)  # request of each row
    # Offset of each row inside its request: 0..q_r-1.
    offsets = np.arange(num_decode_tokens, dtype=np.int64) - qsl[:-1][row_req]
    seq_lens = seq_lens_cpu[:num_decodes].numpy().astype(np.int64)
    lens = torch.from_numpy((seq_lens - q_lens)[row_req] + 1 + offsets)
    table = block_table[torch.from_numpy(row_req).to(block_table.device)]
    return table, lens


class CPUAttentionBackendImpl(AttentionImpl[CPUAttentionMetadata]):
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
            raise NotImplementedError(f"CPU attention: attn_type {attn_type!r} is not built.")
        if attn_type == AttentionType.ENCODER_ONLY and sliding_window is not None:
            raise NotImplementedError("CPU attention: encoder-only sliding windows are not built.")
        if alibi_slopes is not None:
            raise NotImplementedError("CPU attention: ALiBi is not built.")
        if kv_cache_dtype != "auto":
            raise NotImplementedError(
                f"CPU attention: kv_cache_dtype {kv_cache_dtype!r} is not built (use 'auto')."
            )
        if kv_sharing_target_layer_name is not None:
            raise NotImplementedError("CPU attention: KV sharing between layers is not built.")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads {num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}."
            )
        self.num_queries_per_kv = self.num_heads // self.num_kv_heads
        self.sliding_window = sliding_window
        self.attn_type = attn_type
        self.logits_soft_cap = logits_soft_cap if logits_soft_cap else None
        # fp32/bf16 on CPU have compiled kernels when vllm._C is built.
        self.use_compiled = ops.cpu_ops_available()

    def forward(
        self,
        layer: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: CPUAttentionMetadata,
        output: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """query [T, H, D], key/value [T, Hkv, D], kv_cache (2, NB, BS, Hkv, D)
        -> output [T, H, D]; rows past `num_actual_tokens` are zero."""
        md = attn_metadata
        if output is None:
            output = torch.empty_like(query)
        n = md.num_actual_tokens
        if n < query.shape[0]:
            output[n:].zero_()
        if self.attn_type == AttentionType.ENCODER_ONLY or not md.causal:
            self._encoder_only(query, key, value, md, output)
            return output
        key_cache, value_cache = kv_cache.unbind(0)  # each [NB, BS, Hkv, D]
        compiled = (
            self.use_compiled
            and query.device.type == "cpu"
            and query.dtype in (torch.float32, torch.bfloat16, torch.float16)
        )
        if (
            compiled
            and key.stride(-1) == 1
            and key.stride(-2) == self.head_size
            and value.stride(-1) == 1
            and value.stride(-2) == self.head_size
        ):
            ops.reshape_and_cache(key[:n], value[:n], key_cache, value_cache, md.all_slots)
        else:
            self._write_kv(key[:n], value[:n], key_cache, value_cache, md)
        if md.num_decodes > 0:
            nd = md.num_decode_tokens
            if compiled and output.stride(-1) == 1:
                ops.paged_attention_decode(
                    output[:nd],
                    query[:nd],
                    key_cache,
                    value_cache,
                    md.decode_block_table,
                    md.decode_seq_lens,
                    self.scale,
                    self.sliding_window,
                    self.logits_soft_cap,
                )
            else:
                output[:nd] = self._decode(query[:nd], key_cache, value_cache, md)
        if md.num_prefills > 0:
            self._prefill(query, key, value, key_cache, value_cache, md, output)
        return output

    @staticmethod
    def _write_kv(
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        md: CPUAttentionMetadata,
    ) -> None:
        """Scatter the step's new K/V rows into their slots."""
        if md.write_token_ids is not None:
            key = key.index_select(0, md.write_token_ids)
            value = value.index_select(0, md.write_token_ids)
        # [NB, BS, Hkv, D] -> [NB * BS, Hkv, D]: row index == slot.
        key_cache.view(-1, *key_cache.shape[2:]).index_copy_(0, md.slot_mapping, key)
        value_cache.view(-1, *value_cache.shape[2:]).index_copy_(0, md.slot_mapping, value)

    def _gather(self, cache: torch.Tensor, block_ids: torch.Tensor, num_seqs: int) -> torch.Tensor:
        """Blocks of [NB, BS, Hkv, D] by id -> contiguous [num_seqs, Hkv, L, D]
        (L = blocks per sequence * BS): one gather, one head-major copy, so the
        matmuls below run on dense batches."""
        g = cache.index_select(0, block_ids)  # [num_seqs * blocks, BS, Hkv, D]
        g = g.view(num_seqs, -1, self.num_kv_heads, self.head_size)
        return g.transpose(1, 2).contiguous()

    def _decode(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        md: CPUAttentionMetadata,
    ) -> torch.Tensor:
        """All decode requests at once: query [B, H, D] -> [B, H, D].

        GQA without repeating K/V: the G = H / Hkv query heads of a KV head
        are the rows of one [G, D] x [D, L] product."""
        plan = md.decode_plan(self.sliding_window)
        b = query.shape[0]
        k = self._gather(key_cache, plan.block_ids, b)  # [B, Hkv, L, D]
        v = self._gather(value_cache, plan.block_ids, b)
        q = query.reshape(b, self.num_kv_heads, self.num_queries_per_kv, self.head_size)
        out = self._grouped_attention(q, k, v, 1, bias=plan.key_bias)  # [B, Hkv, G, D]
        return out.view(b, self.num_heads, self.head_size)

    def _prefill(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        md: CPUAttentionMetadata,
        output: torch.Tensor,
    ) -> None:
        """Per request: keys come from the block table when a prefix is cached,
        else straight from this step's K/V (they are the whole sequence)."""
        for req, plan in zip(md.prefills, md.prefill_plans(self.sliding_window)):
            s, e = req.query_start, req.query_end
            if plan.block_ids is None:
                k = key[s:e].transpose(0, 1).unsqueeze(0)  # [1, Hkv, Lq, D]
                v = value[s:e].transpose(0, 1).unsqueeze(0)
            else:
                k_len = req.seq_len - plan.key_start
                k = self._gather(key_cache, plan.block_ids, 1)[:, :, :k_len]
                v = self._gather(value_cache, plan.block_ids, 1)[:, :, :k_len]
            q = query[s:e].transpose(0, 1)  # [H, Lq, D]
            if plan.use_sdpa and self.logits_soft_cap is None:
                out = F.scaled_dot_product_attention(
                    q.unsqueeze(0),
                    k,
                    v,
                    attn_mask=plan.mask,
                    is_causal=plan.mask is None,
                    scale=self.scale,
                    enable_gqa=self.num_queries_per_kv > 1,
                )[0]  # [H, Lq, D]
            else:
                masked_out = plan.masked_out
                if masked_out is None:  # SDPA-sized but soft-capped: causal by hand
                    masked_out = _masked_out_of(plan.mask, e - s, k.shape[2], q.device)
                # [H, Lq, D] -> [1, Hkv, G * Lq, D]: rows of a KV head's query heads.
                qg = q.reshape(1, self.num_kv_heads, -1, self.head_size)
                out = self._grouped_attention(qg, k, v, e - s, masked_out=masked_out)
                out = out.view(self.num_heads, e - s, self.head_size)
            output[s:e] = out.transpose(0, 1)

    def _encoder_only(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        md: CPUAttentionMetadata,
        output: torch.Tensor,
    ) -> None:
        """Bidirectional attention of each request over its own tokens of
        this step; the KV cache (empty for these layers) is never touched."""
        if md.causal or self.attn_type != AttentionType.ENCODER_ONLY:
            raise ValueError(
                "CPU attention: an encoder-only layer got causal metadata, or a decoder "
                "layer non-causal metadata (the layer and its builder disagree)."
            )
        buckets: list[EncoderBucket] = []
        if self.logits_soft_cap is not None:  # SDPA has no soft cap: one by one
            singles = list(range(len(md.prefills)))
        else:
            singles, buckets = md.encoder_plan()
        if buckets:
            bucketed_attention(query, key, value, buckets, self.scale, output)
        for i in singles:
            s, e = md.prefills[i].query_start, md.prefills[i].query_end
            q = query[s:e].transpose(0, 1)  # [H, L, D]
            k = key[s:e].transpose(0, 1).unsqueeze(0)  # [1, Hkv, L, D]
            v = value[s:e].transpose(0, 1).unsqueeze(0)
            if (e - s) * (e - s) > _SDPA_MIN_SCORES and self.logits_soft_cap is None:
                out = F.scaled_dot_product_attention(
                    q.unsqueeze(0),
                    k,
                    v,
                    scale=self.scale,
                    enable_gqa=self.num_queries_per_kv > 1,
                )[0]  # [H, L, D]
            else:
                qg = q.reshape(1, self.num_kv_heads, -1, self.head_size)
                out = self._grouped_attention(qg, k, v, e - s)
                out = out.view(self.num_heads, e - s, self.head_size)
            output[s:e] = out.transpose(0, 1)

    def _grouped_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_len: int,
        bias: torch.Tensor | None = None,
        masked_out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q [B, Hkv, G * q_len, D] (rows ordered (g, i)), k/v [B, Hkv, L, D]
        -> [B, Hkv, G * q_len, D].

        `bias` (additive float) or `masked_out` (bool, True = hidden) must
        broadcast to the scores viewed as [B, Hkv, G, q_len, L]. Scores are
        products in the model dtype, then soft-capped / masked / softmaxed in
        float32 (as transformers' eager attention does)."""
        b, hkv, rows, _ = q.shape
        scores = torch.matmul(q, k.transpose(-1, -2)).float()  # [B, Hkv, G * q_len, L]
        scores.mul_(self.scale)
        if self.logits_soft_cap is not None:
            cap = self.logits_soft_cap
            scores.div_(cap).tanh_().mul_(cap)
        s5 = scores.view(b, hkv, rows // q_len, q_len, -1)
        if bias is not None:
            s5.add_(bias)
        if masked_out is not None:
            s5.masked_fill_(masked_out, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        return torch.matmul(probs, v)


def _masked_out_of(
    mask: torch.Tensor | None, q_len: int, k_len: int, device: torch.device
) -> torch.Tensor:
    """The `masked_out` form of an SDPA mask (None = causal with q_len == k_len)."""
    if mask is not None:
        return ~mask
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).triu_(1)
