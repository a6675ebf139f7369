"""What the runner tells the rejection sampler about a step's drafts
(upstream: vllm/v1/spec_decode/metadata.py).

Layout. Request b proposed `num_draft_tokens[b]` draft tokens; they are
flattened, request after request, into `draft_token_ids` [num_tokens]. The
target model scored each draft position plus one bonus position per request,
so its logits have num_tokens + batch_size rows; `target_logits_indices`
[num_tokens] picks the row scoring each draft token and `bonus_logits_indices`
[batch_size] the row after a request's last draft. `logits_indices` are the
hidden-state rows the runner computes logits for ([num_tokens + batch_size]).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class SpecDecodeMetadata:
    # [num_tokens] int32: the drafts of all requests, flattened.
    draft_token_ids: torch.Tensor
    # [batch_size]: drafts per request (host list; may hold zeros).
    num_draft_tokens: list[int]
    # [batch_size] int32: inclusive cumulative sum of num_draft_tokens.
    cu_num_draft_tokens: torch.Tensor
    # [batch_size] int32: inclusive cumulative sum of (num_draft_tokens + 1).
    cu_num_sampled_tokens: torch.Tensor
    # [num_tokens]: logits row of each draft position.
    target_logits_indices: torch.Tensor
    # [batch_size]: logits row of each request's bonus position.
    bonus_logits_indices: torch.Tensor
    # [num_tokens + batch_size]: hidden-state rows to compute logits for.
    logits_indices: torch.Tensor
    max_spec_len: int = field(init=False)

    def __post_init__(self) -> None:
        self.max_spec_len = max(self.num_draft_tokens, default=0)

    @classmethod
    def make_dummy(
        cls, draft_token_ids: list[list[int]], device: torch.device
    ) -> SpecDecodeMetadata:
        """Metadata for the given drafts with the logits laid out request by
        request (each request's draft rows, then its bonus row), as the runner
        lays them out. (Upstream's make_dummy leaves the index tensors zero;
        these are the real indices for that layout, so tests can use them.)"""
        num_draft_tokens = [len(ids) for ids in draft_token_ids]
        flat = [tok for ids in draft_token_ids for tok in ids]
        cu_draft = np.cumsum(num_draft_tokens, dtype=np.int32)
        cu_sampled = np.cumsum([n + 1 for n in num_draft_tokens], dtype=np.int32)
        # Request b's rows start at cu_sampled[b] - (n_b + 1).
        starts = cu_sampled - np.asarray(num_draft_tokens, dtype=np.int32) - 1
        target = np.concatenate(
            [np.arange(s, s + n, dtype=np.int32) for s, n in zip(starts, num_draft_tokens)]
            or [np.zeros(0, dtype=np.int32)]
        )
        bonus = cu_sampled - 1
        logits_indices = np.arange(len(flat) + len(draft_token_ids), dtype=np.int32)

        def to_dev(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).to(device)

        return cls(
            draft_token_ids=torch.tensor(flat, dtype=torch.int32, device=device),
            num_draft_tokens=num_draft_tokens,
            cu_num_draft_tokens=to_dev(cu_draft),
            cu_num_sampled_tokens=to_dev(cu_sampled),
            target_logits_indices=to_dev(target),
            bonus_logits_indices=to_dev(bonus),
            logits_indices=to_dev(logits_indices),
        )
