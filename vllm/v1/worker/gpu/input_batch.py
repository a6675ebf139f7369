"""The per-step batch of Model Runner V2 and the functions that prepare it
(upstream: vllm/v1/worker/gpu/input_batch.py).

`InputBatch` is a view built fresh every step: batch position i holds the
request in row `idx_mapping[i]` of `RequestState`. The token-level inputs are
produced on the device from the request rows, so the host only hands over
small per-request arrays:

- `prepare_prefill_inputs`: prompt (prefill) tokens from `all_token_ids`;
- `prepare_pos_seq_lens`: positions and sequence lengths from `num_computed_tokens`;
- `combine_sampled_and_draft_tokens`: decode input ids from the device-resident
  last sampled (and draft) tokens, plus `logits_indices`;
- `get_num_sampled_and_rejected` / `post_update`: after sampling, record the
  sampled tokens and advance the counters.

Each function dispatches to a Triton kernel on CUDA and to an equivalent torch
path elsewhere (the kernels live in `input_batch_kernels.py`); the tests run
both and compare them.

Token layout: request i's tokens are `query_start_loc[i]:query_start_loc[i+1]`
of the flattened batch; the logits of request i are rows
`cu_num_logits[i]:cu_num_logits[i+1]` (one per request without drafts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from vllm.triton_utils import HAS_TRITON
from vllm.v1.worker.gpu import input_batch_kernels as kernels
from vllm.v1.worker.gpu.block_table import token_batch_indices
from vllm.v1.worker.gpu.buffer_utils import async_copy_to_gpu

if TYPE_CHECKING:
    from vllm.v1.worker.gpu.states import RequestState


class InputBuffers:
    """Preallocated device buffers the step's inputs are written into."""

    def __init__(self, max_num_reqs: int, max_num_tokens: int, device: torch.device) -> None:
        self.max_num_reqs = max_num_reqs
        self.max_num_tokens = max_num_tokens
        self.device = device
        self.input_ids = torch.zeros(max_num_tokens, dtype=torch.int32, device=device)
        self.positions = torch.zeros(max_num_tokens, dtype=torch.int64, device=device)
        self.query_start_loc = torch.zeros(max_num_reqs + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)


@dataclass
class InputBatch:
    # batch position -> request id
    req_ids: list[str]
    num_reqs: int
    # [num_reqs] batch position -> request row
    idx_mapping: torch.Tensor
    idx_mapping_np: np.ndarray
    # [num_logits] logits row -> request row (== idx_mapping without drafts)
    expanded_idx_mapping: torch.Tensor
    # [num_reqs]
    num_scheduled_tokens: np.ndarray
    num_tokens: int
    num_tokens_after_padding: int
    num_draft_tokens: int
    # [num_reqs + 1]
    query_start_loc: torch.Tensor
    query_start_loc_np: np.ndarray
    # [num_reqs] computed + scheduled tokens
    seq_lens: torch.Tensor
    seq_lens_np: np.ndarray
    # [num_reqs] tokens in the KV cache before this step
    num_computed_tokens_np: np.ndarray
    # [num_tokens_after_padding]
    input_ids: torch.Tensor
    positions: torch.Tensor
    # [num_logits] token rows whose hidden states are sampled
    logits_indices: torch.Tensor
    # [num_reqs + 1]
    cu_num_logits: torch.Tensor
    cu_num_logits_np: np.ndarray
    has_structured_output_reqs: bool = False
    # layer name -> attention metadata (None in a dummy run without attention)
    attn_metadata: dict[str, Any] | None = None

    @classmethod
    def make_dummy(
        cls,
        num_reqs: int | None,
        num_tokens: int,
        input_buffers: InputBuffers,
        device: torch.device,
    ) -> InputBatch:
        """A batch of `num_reqs` (default min(num_tokens, max_num_reqs)) fresh
        requests sharing `num_tokens` tokens (input ids 0, positions 0..n-1
        within each request), for warm-up, profiling and capture runs (no
        request state is touched)."""
        assert 0 < num_tokens <= input_buffers.max_num_tokens
        num_reqs = num_reqs or min(num_tokens, input_buffers.max_num_reqs)
        assert 0 < num_reqs <= num_tokens
        num_scheduled = np.full(num_reqs, num_tokens // num_reqs, dtype=np.int32)
        num_scheduled[-1] += num_tokens % num_reqs
        qsl_np = np.zeros(num_reqs + 1, dtype=np.int32)
        np.cumsum(num_scheduled, out=qsl_np[1:])
        qsl = input_buffers.query_start_loc[: num_reqs + 1]
        qsl.copy_(torch.from_numpy(qsl_np))
        seq_lens = input_buffers.seq_lens[:num_reqs]
        seq_lens.copy_(torch.from_numpy(num_scheduled))
        positions = input_buffers.positions[:num_tokens]
        positions.copy_(
            torch.from_numpy(np.arange(num_tokens) - np.repeat(qsl_np[:-1], num_scheduled))
        )
        idx_mapping = torch.arange(num_reqs, dtype=torch.int64, device=device)
        cu_np = np.arange(num_reqs + 1, dtype=np.int32)
        return cls(
            req_ids=[f"_dummy_req_{i}" for i in range(num_reqs)],
            num_reqs=num_reqs,
            idx_mapping=idx_mapping,
            idx_mapping_np=np.arange(num_reqs, dtype=np.int64),
            expanded_idx_mapping=idx_mapping,
            num_scheduled_tokens=num_scheduled,
            num_tokens=num_tokens,
            num_tokens_after_padding=num_tokens,
            num_draft_tokens=0,
            query_start_loc=qsl,
            query_start_loc_np=qsl_np,
            seq_lens=seq_lens,
            seq_lens_np=num_scheduled.copy(),
            num_computed_tokens_np=np.zeros(num_reqs, dtype=np.int32),
            input_ids=input_buffers.input_ids[:num_tokens].zero_(),
            positions=positions,
            logits_indices=qsl[1:].to(torch.int64) - 1,
            cu_num_logits=torch.from_numpy(cu_np).to(device),
            cu_num_logits_np=cu_np,
        )


def _use_triton(t: torch.Tensor) -> bool:
    return t.is_cuda and HAS_TRITON


def _token_rows_and_offsets(
    idx_mapping: torch.Tensor, query_start_loc: torch.Tensor, num_tokens: int
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """Per flattened token: (batch position, request row, offset in its query).

    With as many tokens as requests every query has length 1 (a decode-only
    batch): token i is request i at offset 0, returned as (None, rows, None)
    so the torch paths skip the index arithmetic (the common step on CPU,
    where each small torch op costs microseconds).
    """
    rows = idx_mapping.to(torch.int64)
    if num_tokens == rows.shape[0]:
        return None, rows, None
    batch = token_batch_indices(query_start_loc, num_tokens)
    offsets = torch.arange(num_tokens, device=batch.device) - query_start_loc[batch]
    return batch, rows[batch], offsets


# ---- prepare_prefill_inputs ------------------------------------------------------


def prepare_prefill_inputs(
    input_ids: torch.Tensor,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    all_token_ids: torch.Tensor,
    prefill_len: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    num_tokens: int,
) -> None:
    """For every request still prefilling (num_computed < prefill_len), copy its
    next query_len prefill tokens from `all_token_ids` into `input_ids`.
    Decode requests are left to `combine_sampled_and_draft_tokens`."""
    fn = (
        kernels.prepare_prefill_inputs_triton
        if _use_triton(input_ids)
        else _prepare_prefill_inputs_torch
    )
    fn(
        input_ids,
        idx_mapping,
        query_start_loc,
        all_token_ids,
        prefill_len,
        num_computed_tokens,
        num_tokens,
    )


def _prepare_prefill_inputs_torch(
    input_ids: torch.Tensor,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    all_token_ids: torch.Tensor,
    prefill_len: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    num_tokens: int,
) -> None:
    _, rows, offsets = _token_rows_and_offsets(idx_mapping, query_start_loc, num_tokens)
    computed = num_computed_tokens[rows]
    is_prefill = computed < prefill_len[rows]
    stride = all_token_ids.stride(0)
    cols = computed.to(torch.int64) if offsets is None else computed + offsets
    # Decode rows read one column past their prefill; keep that inside the row.
    cols.clamp_(max=stride - 1)
    tokens = all_token_ids.view(-1)[rows * stride + cols]
    out = input_ids[:num_tokens]
    torch.where(is_prefill, tokens.to(out.dtype), out, out=out)


# ---- prepare_pos_seq_lens ----------------------------------------------------------


def prepare_pos_seq_lens(
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    pos: torch.Tensor,
    seq_lens: torch.Tensor,
    num_tokens: int,
) -> None:
    """positions of every token (num_computed + offset in its query) and
    seq_lens = num_computed + query_len; seq_lens past num_reqs are zeroed."""
    fn = kernels.prepare_pos_seq_lens_triton if _use_triton(pos) else _prepare_pos_seq_lens_torch
    fn(idx_mapping, query_start_loc, num_computed_tokens, pos, seq_lens, num_tokens)


def _prepare_pos_seq_lens_torch(
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    pos: torch.Tensor,
    seq_lens: torch.Tensor,
    num_tokens: int,
) -> None:
    num_reqs = idx_mapping.shape[0]
    computed = num_computed_tokens[idx_mapping.to(torch.int64)]
    query_lens = query_start_loc[1:] - query_start_loc[:-1]
    torch.add(computed, query_lens, out=seq_lens[:num_reqs])
    seq_lens[num_reqs:] = 0
    batch, _, offsets = _token_rows_and_offsets(idx_mapping, query_start_loc, num_tokens)
    if batch is None or offsets is None:  # both or neither
        pos[:num_tokens] = computed
    else:
        torch.add(computed[batch], offsets, out=pos[:num_tokens])


# ---- combine_sampled_and_draft_tokens ------------------------------------------------


def combine_sampled_and_draft_tokens(
    input_ids: torch.Tensor,
    idx_mapping: torch.Tensor,
    last_sampled_tokens: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    prefill_len: torch.Tensor,
    draft_tokens: torch.Tensor,
    cu_num_logits: torch.Tensor,
    num_logits: int,
) -> torch.Tensor:
    """Fill the input ids of decoding requests on the device and return
    `logits_indices` [num_logits] int64.

    Request i's logits come from its last `n_i = cu_num_logits[i+1] -
    cu_num_logits[i]` tokens: the token sampled last step, then `n_i - 1`
    draft tokens. For a request past its prefill (seq_len > prefill_len), the
    first of them reads `last_sampled_tokens[row]` (when it lies past the
    prefill) and the rest read `draft_tokens[row]`. This is what lets the
    scheduler run a step ahead: the inputs never wait for the host to see
    the sampled tokens.
    """
    fn = (
        kernels.combine_sampled_and_draft_tokens_triton
        if _use_triton(input_ids)
        else _combine_sampled_and_draft_tokens_torch
    )
    return fn(
        input_ids,
        idx_mapping,
        last_sampled_tokens,
        query_start_loc,
        seq_lens,
        prefill_len,
        draft_tokens,
        cu_num_logits,
        num_logits,
    )


def _combine_sampled_and_draft_tokens_torch(
    input_ids: torch.Tensor,
    idx_mapping: torch.Tensor,
    last_sampled_tokens: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    prefill_len: torch.Tensor,
    draft_tokens: torch.Tensor,
    cu_num_logits: torch.Tensor,
    num_logits: int,
) -> torch.Tensor:
    num_reqs = idx_mapping.shape[0]
    rows = idx_mapping.to(torch.int64)
    if num_logits == num_reqs:
        # One logit per request (no drafts): the last token, which takes the
        # last sampled token when it lies past the prefill (seq_len > prefill_len).
        logits_indices = query_start_loc[1:].to(torch.int64) - 1
        decoding = seq_lens[:num_reqs] > prefill_len[rows]
        sampled = last_sampled_tokens[rows, 0].to(input_ids.dtype)
        input_ids[logits_indices] = torch.where(decoding, sampled, input_ids[logits_indices])
        return logits_indices
    # Logit row -> batch position, and its index k among the request's logits.
    batch, _, k = _token_rows_and_offsets(idx_mapping, cu_num_logits, num_logits)
    assert batch is not None and k is not None
    logits_per_req = (cu_num_logits[1:] - cu_num_logits[:-1]).to(torch.int64)
    query_end = query_start_loc[1:].to(torch.int64)
    logits_indices = (query_end - logits_per_req)[batch] + k

    seq_len = seq_lens[:num_reqs].to(torch.int64)
    req_prefill_len = prefill_len[rows].to(torch.int64)
    first_logit_pos = seq_len - logits_per_req  # sequence position of k == 0
    decoding = (seq_len > req_prefill_len)[batch]
    take_sampled = decoding & (k == 0) & (first_logit_pos >= req_prefill_len)[batch]
    take_draft = decoding & (k > 0)
    token_rows = rows[batch]
    sampled = last_sampled_tokens[token_rows, 0]
    if draft_tokens.shape[1] > 0:
        draft_col = (k - 1).clamp_(min=0, max=draft_tokens.shape[1] - 1)
        drafts = draft_tokens[token_rows, draft_col]
    else:
        drafts = sampled  # no draft columns: take_draft is all False
    current = input_ids[logits_indices]
    new = torch.where(
        take_sampled,
        sampled.to(input_ids.dtype),
        torch.where(take_draft, drafts.to(input_ids.dtype), current),
    )
    input_ids[logits_indices] = new
    return logits_indices


def copy_query_start_loc(
    num_scheduled: np.ndarray, out: torch.Tensor
) -> tuple[torch.Tensor, np.ndarray]:
    """query_start_loc [num_reqs + 1] = 0, cumsum(num_scheduled): written into
    `out` (device) and returned with its host copy."""
    qsl_np = np.empty(len(num_scheduled) + 1, dtype=np.int32)
    qsl_np[0] = 0
    np.cumsum(num_scheduled, out=qsl_np[1:])
    return async_copy_to_gpu(qsl_np, out=out[: len(qsl_np)]), qsl_np


def prepare_token_inputs(
    bufs: InputBuffers,
    states: RequestState,
    idx_mapping: torch.Tensor,
    idx_mapping_np: np.ndarray,
    query_start_loc: torch.Tensor,
    cu_num_logits: torch.Tensor,
    num_tokens: int,
    num_logits: int | None = None,
) -> tuple[torch.Tensor, np.ndarray]:
    """A step's input ids, positions and sequence lengths, written into `bufs`
    on the device from the request rows `idx_mapping` (batch order);
    `num_logits` (default one per request) counts draft rows too. Returns
    (logits_indices [num_logits] int64, the rows' computed-token counts
    before this step [num_reqs], host)."""
    num_computed = states.num_computed_tokens.gpu
    num_computed_np = states.num_computed_tokens_np[idx_mapping_np]
    if (num_computed_np < states.prefill_len.np[idx_mapping_np]).any():
        # Some request is prefilling (the host knows; in a decode-only step
        # every input token comes from combine_sampled_and_draft_tokens).
        prepare_prefill_inputs(
            bufs.input_ids,
            idx_mapping,
            query_start_loc,
            states.all_token_ids.gpu,
            states.prefill_len.gpu,
            num_computed,
            num_tokens,
        )
    prepare_pos_seq_lens(
        idx_mapping, query_start_loc, num_computed, bufs.positions, bufs.seq_lens, num_tokens
    )
    num_reqs = len(idx_mapping_np)
    logits_indices = combine_sampled_and_draft_tokens(
        bufs.input_ids,
        idx_mapping,
        states.last_sampled_tokens,
        query_start_loc,
        bufs.seq_lens[:num_reqs],
        states.prefill_len.gpu,
        states.draft_tokens,
        cu_num_logits,
        num_reqs if num_logits is None else num_logits,
    )
    return logits_indices, num_computed_np


# ---- after sampling -----------------------------------------------------------------


def get_num_sampled_and_rejected(
    num_sampled: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_num_logits: torch.Tensor,
    idx_mapping: torch.Tensor,
    prefill_len: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A request still mid-prefill (seq_len < prefill_len) samples nothing and
    rejects nothing; otherwise rejected = logits - sampled. Updates
    `num_sampled` in place; returns (num_sampled, num_rejected)."""
    fn = (
        kernels.get_num_sampled_and_rejected_triton
        if _use_triton(num_sampled)
        else _get_num_sampled_and_rejected_torch
    )
    return fn(num_sampled, seq_lens, cu_num_logits, idx_mapping, prefill_len)


def _get_num_sampled_and_rejected_torch(
    num_sampled: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_num_logits: torch.Tensor,
    idx_mapping: torch.Tensor,
    prefill_len: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    num_reqs = idx_mapping.shape[0]
    chunked = seq_lens[:num_reqs] < prefill_len[idx_mapping.to(torch.int64)]
    num_sampled.masked_fill_(chunked, 0)
    num_logits = (cu_num_logits[1:] - cu_num_logits[:-1]).to(num_sampled.dtype)
    num_rejected = (num_logits - num_sampled).masked_fill_(chunked, 0)
    return num_sampled, num_rejected


def num_sampled_and_rejected(
    input_batch: InputBatch,
    prefill_len_np: np.ndarray,
    prefill_len: torch.Tensor,
    ones: torch.Tensor,
    zeros: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[num_reqs] tokens sampled and drafts rejected per request of the batch:
    1 and 0, except 0 and 0 for requests still mid-prefill. Without drafts the
    host knows whether any request is mid-prefill, and the device work is
    skipped in the common case where none is (`ones` / `zeros`: read-only
    [max_num_reqs] int32 buffers; `prefill_len(_np)`: per request row)."""
    num_reqs = input_batch.num_reqs
    batch_prefill_len_np = prefill_len_np[input_batch.idx_mapping_np]
    if (
        input_batch.num_draft_tokens == 0
        and (input_batch.seq_lens_np >= batch_prefill_len_np).all()
    ):
        return ones[:num_reqs], zeros[:num_reqs]
    return get_num_sampled_and_rejected(
        ones[:num_reqs].clone(),
        input_batch.seq_lens,
        input_batch.cu_num_logits,
        input_batch.idx_mapping,
        prefill_len,
    )


def post_update(
    idx_mapping: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    last_sampled_tokens: torch.Tensor,
    sampled_tokens: torch.Tensor,
    num_sampled: torch.Tensor,
    num_rejected: torch.Tensor,
    query_start_loc: torch.Tensor,
    all_token_ids: torch.Tensor,
    total_len: torch.Tensor,
) -> None:
    """Record a step's results in the request rows, on the device.

    For batch position i (row r = idx_mapping[i]; r < 0 means skip): its first
    num_sampled[i] tokens of `sampled_tokens[i]` are appended to
    all_token_ids[r] at total_len[r], the last becomes last_sampled_tokens[r],
    and num_computed_tokens[r] advances by query_len - num_rejected[i].
    """
    fn = kernels.post_update_triton if _use_triton(num_computed_tokens) else _post_update_torch
    fn(
        idx_mapping,
        num_computed_tokens,
        last_sampled_tokens,
        sampled_tokens,
        num_sampled,
        num_rejected,
        query_start_loc,
        all_token_ids,
        total_len,
    )


def _post_update_torch(
    idx_mapping: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    last_sampled_tokens: torch.Tensor,
    sampled_tokens: torch.Tensor,
    num_sampled: torch.Tensor,
    num_rejected: torch.Tensor,
    query_start_loc: torch.Tensor,
    all_token_ids: torch.Tensor,
    total_len: torch.Tensor,
) -> None:
    valid = idx_mapping >= 0
    all_valid = bool(valid.all())
    rows = idx_mapping.to(torch.int64)
    if not all_valid:
        rows = rows.clamp(min=0)
    n = num_sampled.to(torch.int64)
    if not all_valid:
        n = n.masked_fill(~valid, 0)
    start = total_len[rows].to(torch.int64)
    # Requests that sampled anything (rows are distinct, so scatters do not
    # collide); usually all of them, which saves the masked selections.
    has = n > 0
    if bool(has.all()):
        sel_rows, sel_n, sel_start, sel_tokens = rows, n, start, sampled_tokens
    else:
        sel_rows, sel_n, sel_start = rows[has], n[has], start[has]
        sel_tokens = sampled_tokens[has]
    if sampled_tokens.shape[1] == 1:
        dst, tokens = sel_rows * all_token_ids.stride(0) + sel_start, sel_tokens[:, 0]
        last = tokens
    else:
        # [num_sel, max_sampled] -> the sel_n[i] leading tokens of each row.
        k = torch.arange(sampled_tokens.shape[1], device=n.device)
        keep = k[None, :] < sel_n[:, None]
        dst = (sel_rows[:, None] * all_token_ids.stride(0) + sel_start[:, None] + k)[keep]
        tokens = sel_tokens[keep]
        last = sel_tokens.gather(1, (sel_n - 1)[:, None])[:, 0]
    all_token_ids.view(-1)[dst] = tokens.to(all_token_ids.dtype)
    last_sampled_tokens[sel_rows, 0] = last.to(last_sampled_tokens.dtype)
    total_len[sel_rows] = (sel_start + sel_n).to(total_len.dtype)

    delta = (query_start_loc[1:] - query_start_loc[:-1]) - num_rejected
    if all_valid:
        num_computed_tokens[rows] += delta.to(num_computed_tokens.dtype)
    else:
        num_computed_tokens[rows[valid]] += delta[valid].to(num_computed_tokens.dtype)
