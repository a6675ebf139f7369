"""Sampling edits at speculative positions (the rejection sampler's helpers).

Under speculative decoding the target scores, per request r with n_r drafts
d_0..d_{n_r - 1}, n_r draft rows and one bonus row. Row j (draft or bonus,
j = 0..n_r) predicts the token at position j past r's outputs, so every edit
that depends on the history sees r's outputs plus d_0..d_{j-1}:

    request r: outputs o, drafts [d0, d1]
    row 0: history o          row 1: history o + [d0]     bonus: o + [d0, d1]

(a row is only emitted when all drafts before it were accepted, so that
history is the one the emitted token really follows). Position-independent
edits (allowed_token_ids, logit_bias, temperature...) just repeat the
request's row; penalties, bad words and min_tokens read the position.

The verifier's output grid is [batch, max_spec_len + 1]: cell (r, j) is
request r's j-th emitted token or PLACEHOLDER_TOKEN_ID (`assemble_output`).
"""

from __future__ import annotations

import torch

from vllm.v1.sample.logits_processor import (
    STR_SPEC_DEC_REJECTS_LOGITSPROCS,
    LogitsProcessors,
    SparseCellsLogitsProcessor,
)
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

PLACEHOLDER_TOKEN_ID = -1


def repeat_indices(num_draft_tokens: list[int], device: torch.device) -> torch.Tensor:
    """[num_tokens] int64: the batch row (request) of each draft position."""
    counts = torch.tensor(num_draft_tokens, dtype=torch.long)
    return torch.arange(len(num_draft_tokens)).repeat_interleave(counts).to(device)


def draft_positions(
    num_draft_tokens: list[int], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(req, pos), each [num_tokens] int64: the request of each draft row
    and its position among the request's drafts (0, 1, ..)."""
    counts = torch.tensor(num_draft_tokens, dtype=torch.long)
    req = torch.arange(len(num_draft_tokens)).repeat_interleave(counts)
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(int(counts.sum())) - starts[req]
    return req.to(device), pos.to(device)


def bonus_positions(
    num_draft_tokens: list[int], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(req, pos), each [batch] int64: row r's bonus row is at position n_r."""
    req = torch.arange(len(num_draft_tokens), device=device)
    return req, torch.tensor(num_draft_tokens, dtype=torch.long, device=device)


def grid_logits_rows(metadata: SpecDecodeMetadata, width: int) -> torch.Tensor:
    """[batch, width]: the logits row scoring each output cell (draft rows,
    then the bonus row; cells past the bonus repeat the bonus row)."""
    n = torch.tensor(metadata.num_draft_tokens, device=metadata.cu_num_draft_tokens.device)
    start = metadata.cu_num_draft_tokens.long() - n
    pos = torch.arange(width, device=n.device)
    tok = (start.unsqueeze(1) + pos).clamp(max=max(metadata.draft_token_ids.numel() - 1, 0))
    bonus = metadata.bonus_logits_indices.long().unsqueeze(1).expand(-1, width)
    if metadata.target_logits_indices.numel() == 0:
        return bonus
    target = metadata.target_logits_indices.long()[tok]
    return torch.where(pos < n.unsqueeze(1), target, bonus)


def histories_with_drafts(
    output_token_ids: list[list[int]], metadata: SpecDecodeMetadata
) -> list[list[int]]:
    """[num_tokens]: for each draft row, the request's outputs plus its
    earlier drafts."""
    drafts = metadata.draft_token_ids.tolist()
    result: list[list[int]] = []
    start = 0
    for out, n in zip(output_token_ids, metadata.num_draft_tokens):
        for pos in range(n):
            result.append([*out, *drafts[start : start + pos]])
        start += n
    return result


def bonus_histories(
    output_token_ids: list[list[int]], metadata: SpecDecodeMetadata
) -> list[list[int]]:
    """[batch]: for each bonus row, the request's outputs plus all its drafts
    (rows without drafts keep the batch's own list)."""
    drafts = metadata.draft_token_ids.tolist()
    result: list[list[int]] = []
    start = 0
    for out, n in zip(output_token_ids, metadata.num_draft_tokens):
        result.append([*out, *drafts[start : start + n]] if n else out)
        start += n
    return result


def apply_logitsprocs_at_positions(
    logits: torch.Tensor,  # [R, vocab], edited in place
    logitsprocs: LogitsProcessors,
    req: torch.Tensor,  # [R] batch row of each logits row
    pos: torch.Tensor,  # [R] position past the request's outputs
) -> torch.Tensor:
    """The argmax-changing logits processors (logit_bias, min_tokens) on rows
    laid out as (request, position) pairs. A processor that cannot place
    its edits at a position is refused (upstream's message)."""
    for processor in logitsprocs.non_argmax_invariant:
        if not isinstance(processor, SparseCellsLogitsProcessor):
            raise ValueError(STR_SPEC_DEC_REJECTS_LOGITSPROCS)
        logits = processor.apply_at_positions(logits, req, pos)
    return logits


def grid_indices(n: torch.Tensor, start: torch.Tensor, max_spec_len: int, num_tokens: int):
    """pos [S], in_range [batch, S] and the flat index [batch, S] of each cell."""
    pos = torch.arange(max_spec_len, device=n.device)
    in_range = pos < n.unsqueeze(1)
    tok = (start.unsqueeze(1) + pos).clamp(max=max(num_tokens - 1, 0))
    return pos, in_range, tok


def count_accepted(
    accepted: torch.Tensor,  # [num_tokens] bool
    n: torch.Tensor,  # [batch] drafts per request
    start: torch.Tensor,  # [batch] first flat index of each request
    max_spec_len: int,
) -> torch.Tensor:
    """[batch]: drafts accepted before the first rejection."""
    if accepted.numel() == 0:
        return torch.zeros_like(n)
    _, in_range, tok = grid_indices(n, start, max_spec_len, accepted.numel())
    grid = accepted[tok] | ~in_range  # padding counts as accepted
    return torch.minimum(grid.long().cumprod(dim=1).sum(dim=1), n)


def assemble_output(
    draft: torch.Tensor,  # [num_tokens]
    replacement: torch.Tensor,  # [num_tokens]
    bonus_token_ids: torch.Tensor,  # [batch, 1]
    n: torch.Tensor,  # [batch]
    start: torch.Tensor,  # [batch]
    num_accepted: torch.Tensor,  # [batch]
    max_spec_len: int,
) -> torch.Tensor:
    """The [batch, max_spec_len + 1] grid: accepted drafts, then the
    replacement at the first rejection (or the bonus when none was
    rejected), then placeholders."""
    batch = n.shape[0]
    out = torch.full(
        (batch, max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32, device=n.device
    )
    if draft.numel() > 0:
        pos, in_range, tok = grid_indices(n, start, max_spec_len, draft.numel())
        keep = pos < num_accepted.unsqueeze(1)
        reject_here = (pos == num_accepted.unsqueeze(1)) & in_range
        filler = torch.where(reject_here, replacement[tok], PLACEHOLDER_TOKEN_ID)
        out[:, :max_spec_len] = torch.where(keep, draft[tok], filler).to(torch.int32)
    rows = torch.nonzero(num_accepted == n).squeeze(1)
    out[rows, n[rows]] = bonus_token_ids.view(-1)[rows].to(torch.int32)
    return out
