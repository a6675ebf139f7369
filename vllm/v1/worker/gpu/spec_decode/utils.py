"""Model Runner V2 speculative-decoding glue (upstream:
vllm/v1/worker/gpu/spec_decode/utils.py `DraftTokensHandler`, and the draft
layout part of model_runner.py's `prepare_inputs`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vllm.v1.outputs import DraftTokenIds


def split_model_output(output: Any, num_tokens: int) -> tuple[Any, list[torch.Tensor] | None]:
    """A target forward's output as (hidden states, EAGLE-3 aux hidden states
    cut to the step's `num_tokens`, or None): a target asked for aux states
    (set_aux_hidden_state_layers) returns the pair."""
    if not isinstance(output, tuple):
        return output, None
    hidden_states, aux = output
    return hidden_states, [a[:num_tokens] for a in aux]


@dataclass
class DraftLayout:
    """Logits rows of a step with drafts: request i owns rows
    cu_num_logits[i] .. cu_num_logits[i+1]-1 (its drafts, then the bonus row)."""

    num_draft_tokens: int  # total over the batch
    cu_num_logits_np: np.ndarray  # [num_reqs + 1] int32
    cu_num_logits: torch.Tensor  # [num_reqs + 1] int32, device
    expanded_idx_mapping: torch.Tensor  # [num_logits] request row of each logits row


def draft_layout(
    scheduled_spec_decode_tokens: dict[str, list[int]],
    req_ids: list[str],
    idx_mapping: torch.Tensor,
    idx_mapping_np: np.ndarray,
    arange: tuple[torch.Tensor, np.ndarray],
    has_speculator: bool,
) -> DraftLayout:
    """The step's logits layout from the drafts the scheduler kept per request
    (their values are the runner's own, already on the device in
    RequestState.draft_tokens; only their count is read here). Without
    drafts request i owns row i: `arange` (device, host) [>= num_reqs + 1]."""
    num_reqs = len(req_ids)
    if not scheduled_spec_decode_tokens:
        return DraftLayout(0, arange[1][: num_reqs + 1], arange[0][: num_reqs + 1], idx_mapping)
    if not has_speculator:
        raise ValueError("Draft tokens were scheduled but no speculative method is configured.")
    num_drafts = np.fromiter(
        (len(scheduled_spec_decode_tokens.get(r, ())) for r in req_ids),
        dtype=np.int32,
        count=num_reqs,
    )
    cu_np = np.zeros(num_reqs + 1, dtype=np.int32)
    np.cumsum(num_drafts + 1, out=cu_np[1:])
    device = idx_mapping.device
    # On the host: torch.repeat_interleave takes milliseconds on a CPU with
    # more than one torch thread (see block_table.token_batch_indices).
    expanded = torch.from_numpy(np.repeat(idx_mapping_np, num_drafts + 1)).to(device)
    return DraftLayout(int(num_drafts.sum()), cu_np, torch.from_numpy(cu_np).to(device), expanded)


class DraftTokensHandler:
    """The drafts of the last step until the engine takes them
    (`take_draft_token_ids`): per request its real drafts, [] for a request
    that drafted nothing (still prefilling, or at max_model_len)."""

    def __init__(self) -> None:
        self._pending: DraftTokenIds | None = None

    def set_draft_tokens(
        self, req_ids: list[str], drafts: torch.Tensor, num_drafts: np.ndarray
    ) -> None:
        """drafts [num_reqs, k] (device), num_drafts [num_reqs] real ones per request."""
        rows = drafts.cpu().tolist()
        lists = [row[:n] for row, n in zip(rows, num_drafts.tolist())]
        self._pending = DraftTokenIds(list(req_ids), lists)

    def get_draft_tokens(self) -> DraftTokenIds | None:
        pending, self._pending = self._pending, None
        return pending
