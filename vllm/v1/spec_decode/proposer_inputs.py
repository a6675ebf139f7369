"""What the V1 model runner hands a model-based drafter after a step's
bookkeeping (no upstream counterpart: upstream passes these as separate
arguments to each proposer's `propose`; one dataclass keeps the draft-model
and EAGLE proposers on the same contract).

Row b of every per-request array is batch row b (`req_ids[b]`). Step order
of `hidden_states`: the step's scheduled tokens request after request in
batch order, drafts included (the layout of the target's forward).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from vllm.v1.worker.gpu_input_batch import InputBatch
    from vllm.v1.worker.utils import AttentionGroup


@dataclass
class ProposerInputs:
    # After bookkeeping: token_ids_cpu holds every known token of each row,
    # this step's emitted tokens included; num_tokens_no_spec per row;
    # block_table holds the step's blocks.
    input_batch: InputBatch
    # Batch rows 0..num_reqs-1.
    req_ids: list[str]
    # [num_reqs] int32: position of this step's first token (before the step).
    num_computed_tokens: np.ndarray
    # [num_reqs] int32: tokens run this step (drafts included).
    num_scheduled_tokens: np.ndarray
    # [num_reqs] int32: tokens of this step now known to be real: accepted
    # drafts + 1 for a row that sampled; num_scheduled for a mid-prefill row.
    num_valid_tokens: np.ndarray
    # [num_reqs] bool: the row emitted a token and num_tokens < max_model_len.
    needs_draft: np.ndarray
    # [total scheduled tokens, hidden]: the target's last hidden states.
    hidden_states: torch.Tensor
    # EAGLE3: the outputs of the target's auxiliary layers; else None.
    aux_hidden_states: list[torch.Tensor] | None
    num_speculative_tokens: int
    # The runner's attention groups per KV cache group; the draft's attention
    # layers join the target's KV cache groups.
    attn_groups: list[list[AttentionGroup]]
