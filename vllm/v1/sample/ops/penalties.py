"""Repetition, frequency and presence penalties, batched
(upstream: vllm/v1/sample/ops/penalties.py and `apply_penalties` of
vllm/model_executor/layers/utils.py).

Each row's prompt and output token ids arrive as a padded [num_reqs, L]
int64 tensor whose padding is `vocab_size`, one past the last real id.
A scatter-add of ones into [num_reqs, vocab_size + 1] counts every token of
every row at once; the padding lands in the extra column, which is dropped:

    tokens = [[5, 5, 2, V]]  ->  counts[0, 5] = 2, counts[0, 2] = 1

Then, with `seen` = appears in the prompt or the output:
  repetition (prompt + output, as transformers' RepetitionPenaltyLogitsProcessor):
      logit > 0 -> logit / r,  logit <= 0 -> logit * r      (seen tokens only)
  frequency (output only, OpenAI's definition):  logit -= f * count
  presence  (output only):                       logit -= p * (count > 0)
Rows without penalties carry r = 1, f = p = 0, which change nothing.
"""

from __future__ import annotations

import numpy as np
import torch


def get_token_bin_counts_and_mask(
    tokens: torch.Tensor, vocab_size: int, num_seqs: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row counts [num_seqs, vocab] int64 of the padded `tokens`, and count > 0."""
    bin_counts = torch.zeros((num_seqs, vocab_size + 1), dtype=torch.long, device=tokens.device)
    bin_counts.scatter_add_(1, tokens, torch.ones_like(tokens))
    bin_counts = bin_counts[:, :vocab_size]
    return bin_counts, bin_counts > 0


def apply_penalties(
    logits: torch.Tensor,
    prompt_tokens_tensor: torch.Tensor,
    output_tokens_tensor: torch.Tensor,
    presence_penalties: torch.Tensor,
    frequency_penalties: torch.Tensor,
    repetition_penalties: torch.Tensor,
) -> torch.Tensor:
    """Apply the three penalties to `logits` [num_seqs, vocab], in place.

    prompt/output_tokens_tensor: [num_seqs, *] int64 padded with vocab_size;
    the penalties: [num_seqs] float.
    """
    num_seqs, vocab_size = logits.shape
    _, prompt_mask = get_token_bin_counts_and_mask(prompt_tokens_tensor, vocab_size, num_seqs)
    output_bin_counts, output_mask = get_token_bin_counts_and_mask(
        output_tokens_tensor, vocab_size, num_seqs
    )
    rep = torch.where(
        prompt_mask | output_mask, repetition_penalties.to(logits.dtype).unsqueeze(1), 1.0
    )
    logits.copy_(torch.where(logits > 0, logits / rep, logits * rep))
    logits -= frequency_penalties.to(logits.dtype).unsqueeze(1) * output_bin_counts
    logits -= presence_penalties.to(logits.dtype).unsqueeze(1) * output_mask
    return logits


def apply_all_penalties(
    logits: torch.Tensor,
    prompt_token_ids: torch.Tensor,
    presence_penalties: torch.Tensor,
    frequency_penalties: torch.Tensor,
    repetition_penalties: torch.Tensor,
    output_token_ids: list[list[int]],
) -> torch.Tensor:
    """`apply_penalties` with the output tokens given as one list per row."""
    _, vocab_size = logits.shape
    output_tokens = make_padded_token_tensor(output_token_ids, pad=vocab_size, device=logits.device)
    return apply_penalties(
        logits,
        prompt_token_ids,
        output_tokens,
        presence_penalties,
        frequency_penalties,
        repetition_penalties,
    )


def make_padded_token_tensor(
    token_ids: list[list[int]], pad: int, device: torch.device
) -> torch.Tensor:
    """[len(token_ids), max(1, longest)] int64, each row right-padded with `pad`.

    Ids outside [0, pad) (e.g. a -1 placeholder) are replaced by `pad` too, so
    they are never counted.
    """
    max_len = max((len(ids) for ids in token_ids), default=0)
    out = np.full((len(token_ids), max(max_len, 1)), pad, dtype=np.int64)
    lengths = np.fromiter((len(ids) for ids in token_ids), dtype=np.int64, count=len(token_ids))
    if max_len:
        # One flat copy instead of one slice assignment per row.
        flat = np.fromiter(
            (t for ids in token_ids for t in ids), dtype=np.int64, count=int(lengths.sum())
        )
        cols = np.arange(max_len) < lengths[:, None]
        out[cols] = flat
        np.putmask(out, (out < 0) | (out > pad), pad)
    return torch.from_numpy(out).to(device, non_blocking=True)
