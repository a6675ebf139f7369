"""Triton kernels of the input-preparation functions in `input_batch.py`.

One program per batch position (request). The launchers take the same
arguments as the torch paths in `input_batch.py`; the docstrings there define
what each computes. Keep these simple: they must stay equal to the torch paths
(tests/v1/worker/gpu/test_input_batch_kernels.py compares them).
"""

from __future__ import annotations

import torch

from vllm.triton_utils import tl, triton


@triton.jit
def _prepare_prefill_inputs_kernel(
    input_ids_ptr,
    idx_mapping_ptr,
    query_start_loc_ptr,
    all_token_ids_ptr,
    all_token_ids_stride,
    prefill_len_ptr,
    num_computed_tokens_ptr,
    BLOCK_SIZE: tl.constexpr,
):
    batch_idx = tl.program_id(0)
    row = tl.load(idx_mapping_ptr + batch_idx).to(tl.int64)
    prefill_len = tl.load(prefill_len_ptr + row)
    num_computed = tl.load(num_computed_tokens_ptr + row)
    if num_computed < prefill_len:
        query_start = tl.load(query_start_loc_ptr + batch_idx)
        query_len = tl.load(query_start_loc_ptr + batch_idx + 1) - query_start
        src = all_token_ids_ptr + row * all_token_ids_stride + num_computed
        for i in range(0, query_len, BLOCK_SIZE):
            block = i + tl.arange(0, BLOCK_SIZE)
            mask = block < query_len
            tokens = tl.load(src + block, mask=mask)
            tl.store(input_ids_ptr + query_start + block, tokens, mask=mask)


def prepare_prefill_inputs_triton(
    input_ids: torch.Tensor,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    all_token_ids: torch.Tensor,
    prefill_len: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    num_tokens: int,
) -> None:
    _prepare_prefill_inputs_kernel[(idx_mapping.shape[0],)](
        input_ids,
        idx_mapping,
        query_start_loc,
        all_token_ids,
        all_token_ids.stride(0),
        prefill_len,
        num_computed_tokens,
        BLOCK_SIZE=1024,
    )


@triton.jit
def _prepare_pos_seq_lens_kernel(
    pos_ptr,
    seq_lens_ptr,
    idx_mapping_ptr,
    query_start_loc_ptr,
    num_computed_tokens_ptr,
    max_num_reqs,
    BLOCK_SIZE: tl.constexpr,
):
    batch_idx = tl.program_id(0)
    num_reqs = tl.num_programs(0) - 1
    if batch_idx == num_reqs:
        # The extra last program zeroes the unused tail of seq_lens.
        for i in range(num_reqs, max_num_reqs, BLOCK_SIZE):
            block = i + tl.arange(0, BLOCK_SIZE)
            tl.store(seq_lens_ptr + block, 0, mask=block < max_num_reqs)
        return
    row = tl.load(idx_mapping_ptr + batch_idx).to(tl.int64)
    num_computed = tl.load(num_computed_tokens_ptr + row)
    start = tl.load(query_start_loc_ptr + batch_idx)
    query_len = tl.load(query_start_loc_ptr + batch_idx + 1) - start
    tl.store(seq_lens_ptr + batch_idx, num_computed + query_len)
    for i in range(0, query_len, BLOCK_SIZE):
        block = i + tl.arange(0, BLOCK_SIZE)
        tl.store(
            pos_ptr + start + block, (num_computed + block).to(tl.int64), mask=block < query_len
        )


def prepare_pos_seq_lens_triton(
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    pos: torch.Tensor,
    seq_lens: torch.Tensor,
    num_tokens: int,
) -> None:
    _prepare_pos_seq_lens_kernel[(idx_mapping.shape[0] + 1,)](
        pos,
        seq_lens,
        idx_mapping,
        query_start_loc,
        num_computed_tokens,
        seq_lens.shape[0],
        BLOCK_SIZE=1024,
    )


@triton.jit
def _combine_sampled_and_draft_tokens_kernel(
    input_ids_ptr,
    idx_mapping_ptr,
    last_sampled_tokens_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    prefill_len_ptr,
    draft_tokens_ptr,
    draft_tokens_stride,
    cu_num_logits_ptr,
    logits_indices_ptr,
    BLOCK_SIZE: tl.constexpr,
):
    batch_idx = tl.program_id(0)
    row = tl.load(idx_mapping_ptr + batch_idx).to(tl.int64)
    logits_start_idx = tl.load(cu_num_logits_ptr + batch_idx)
    num_logits = tl.load(cu_num_logits_ptr + batch_idx + 1) - logits_start_idx
    num_draft = num_logits - 1

    block = tl.arange(0, BLOCK_SIZE)
    query_end = tl.load(query_start_loc_ptr + batch_idx + 1)
    first_token = query_end - num_logits
    tl.store(
        logits_indices_ptr + logits_start_idx + block,
        (first_token + block).to(tl.int64),
        mask=block < num_logits,
    )

    seq_len = tl.load(seq_lens_ptr + batch_idx)
    prefill_len = tl.load(prefill_len_ptr + row)
    if seq_len > prefill_len:
        if seq_len - num_logits >= prefill_len:
            token = tl.load(last_sampled_tokens_ptr + row)
            tl.store(input_ids_ptr + first_token, token.to(tl.int32))
        if num_draft > 0:
            mask = block < num_draft
            drafts = tl.load(draft_tokens_ptr + row * draft_tokens_stride + block, mask=mask)
            tl.store(input_ids_ptr + first_token + 1 + block, drafts.to(tl.int32), mask=mask)


def combine_sampled_and_draft_tokens_triton(
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
    logits_indices = torch.empty(num_logits, dtype=torch.int64, device=input_ids.device)
    # last_sampled_tokens is [max_num_reqs, 1]: its row stride is 1.
    _combine_sampled_and_draft_tokens_kernel[(idx_mapping.shape[0],)](
        input_ids,
        idx_mapping,
        last_sampled_tokens,
        query_start_loc,
        seq_lens,
        prefill_len,
        draft_tokens,
        max(draft_tokens.stride(0), 1),
        cu_num_logits,
        logits_indices,
        BLOCK_SIZE=triton.next_power_of_2(draft_tokens.shape[1] + 1),
    )
    return logits_indices


@triton.jit
def _get_num_sampled_and_rejected_kernel(
    num_sampled_ptr,
    num_rejected_ptr,
    seq_lens_ptr,
    cu_num_logits_ptr,
    idx_mapping_ptr,
    prefill_len_ptr,
):
    batch_idx = tl.program_id(0)
    row = tl.load(idx_mapping_ptr + batch_idx).to(tl.int64)
    chunked = tl.load(seq_lens_ptr + batch_idx) < tl.load(prefill_len_ptr + row)
    num_sampled = tl.load(num_sampled_ptr + batch_idx)
    num_sampled = tl.where(chunked, 0, num_sampled)
    tl.store(num_sampled_ptr + batch_idx, num_sampled)
    num_logits = tl.load(cu_num_logits_ptr + batch_idx + 1) - tl.load(cu_num_logits_ptr + batch_idx)
    num_rejected = tl.where(chunked, 0, num_logits - num_sampled)
    tl.store(num_rejected_ptr + batch_idx, num_rejected)


def get_num_sampled_and_rejected_triton(
    num_sampled: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_num_logits: torch.Tensor,
    idx_mapping: torch.Tensor,
    prefill_len: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    num_rejected = torch.empty_like(num_sampled)
    _get_num_sampled_and_rejected_kernel[(idx_mapping.shape[0],)](
        num_sampled, num_rejected, seq_lens, cu_num_logits, idx_mapping, prefill_len
    )
    return num_sampled, num_rejected


@triton.jit
def _post_update_kernel(
    idx_mapping_ptr,
    num_computed_tokens_ptr,
    last_sampled_tokens_ptr,
    sampled_tokens_ptr,
    sampled_tokens_stride,
    num_sampled_ptr,
    num_rejected_ptr,
    query_start_loc_ptr,
    all_token_ids_ptr,
    all_token_ids_stride,
    total_len_ptr,
    BLOCK_SIZE: tl.constexpr,
):
    batch_idx = tl.program_id(0)
    row = tl.load(idx_mapping_ptr + batch_idx).to(tl.int64)
    if row >= 0:
        total_len = tl.load(total_len_ptr + row)
        num_sampled = tl.load(num_sampled_ptr + batch_idx)
        block = tl.arange(0, BLOCK_SIZE)
        mask = block < num_sampled
        tokens = tl.load(sampled_tokens_ptr + batch_idx * sampled_tokens_stride + block, mask=mask)
        tl.store(
            all_token_ids_ptr + row * all_token_ids_stride + total_len + block,
            tokens.to(tl.int32),
            mask=mask,
        )
        if num_sampled > 0:
            last = tl.load(sampled_tokens_ptr + batch_idx * sampled_tokens_stride + num_sampled - 1)
            tl.store(last_sampled_tokens_ptr + row, last.to(tl.int64))
            tl.store(total_len_ptr + row, total_len + num_sampled)
        query_len = tl.load(query_start_loc_ptr + batch_idx + 1) - tl.load(
            query_start_loc_ptr + batch_idx
        )
        delta = query_len - tl.load(num_rejected_ptr + batch_idx)
        num_computed = tl.load(num_computed_tokens_ptr + row)
        tl.store(num_computed_tokens_ptr + row, num_computed + delta)


def post_update_triton(
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
    _post_update_kernel[(idx_mapping.shape[0],)](
        idx_mapping,
        num_computed_tokens,
        last_sampled_tokens,
        sampled_tokens,
        sampled_tokens.stride(0),
        num_sampled,
        num_rejected,
        query_start_loc,
        all_token_ids,
        all_token_ids.stride(0),
        total_len,
        BLOCK_SIZE=triton.next_power_of_2(sampled_tokens.shape[1]),
    )
