"""Repetition, frequency and presence penalties for Model Runner V2
(upstream: vllm/v1/worker/gpu/sample/penalties.py).

The arithmetic is the V1 op (vllm/v1/sample/ops/penalties.py); what V2 adds
is where the tokens come from: the request rows of `all_token_ids` on the
device, prompt = [0, prompt_len), outputs = [prompt_len, seq_len), gathered
as padded [rows, L] tensors for the penalised rows only. No token list is
kept on the host.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm.sampling_params import SamplingParams
from vllm.v1.sample.ops.penalties import apply_penalties


class PenaltiesState:
    def __init__(self, max_num_reqs: int, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.prompt_len = np.zeros(max_num_reqs, dtype=np.int32)
        self.repetition = np.ones(max_num_reqs, dtype=np.float32)
        self.frequency = np.zeros(max_num_reqs, dtype=np.float32)
        self.presence = np.zeros(max_num_reqs, dtype=np.float32)
        self.use_penalty = np.zeros(max_num_reqs, dtype=bool)

    def add_request(self, req_idx: int, prompt_len: int, params: SamplingParams) -> None:
        self.prompt_len[req_idx] = prompt_len
        self.repetition[req_idx] = params.repetition_penalty
        self.frequency[req_idx] = params.frequency_penalty
        self.presence[req_idx] = params.presence_penalty
        self.use_penalty[req_idx] = (
            params.repetition_penalty != 1.0
            or params.frequency_penalty != 0.0
            or params.presence_penalty != 0.0
        )

    def any_active(self, idx_mapping_np: np.ndarray) -> bool:
        return bool(self.use_penalty[idx_mapping_np].any())

    def apply_penalties(
        self,
        logits: torch.Tensor,
        idx_mapping_np: np.ndarray,
        seq_lens_np: np.ndarray,
        all_token_ids: torch.Tensor,
    ) -> None:
        """Penalise, in place, the batch rows whose request asked for it.
        seq_lens_np: [num_rows] tokens known per row (prompt + outputs so far)."""
        sel = np.flatnonzero(self.use_penalty[idx_mapping_np])
        if sel.size == 0:
            return
        rows = idx_mapping_np[sel]
        prompt_len = self.prompt_len[rows].astype(np.int64)
        num_outputs = np.maximum(seq_lens_np[sel] - prompt_len, 0)
        prompt_ids = self._gather(all_token_ids, rows, np.zeros_like(prompt_len), prompt_len)
        output_ids = self._gather(all_token_ids, rows, prompt_len, num_outputs)
        sel_t = torch.from_numpy(sel).to(logits.device)

        def param(values: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(values[rows]).to(logits.device)

        sub = apply_penalties(
            logits[sel_t],
            prompt_ids,
            output_ids,
            param(self.presence),
            param(self.frequency),
            param(self.repetition),
        )
        logits[sel_t] = sub

    def _gather(
        self, all_token_ids: torch.Tensor, rows: np.ndarray, starts: np.ndarray, lengths: np.ndarray
    ) -> torch.Tensor:
        """[len(rows), max(1, max length)] int64: all_token_ids[row, start:start+len]
        per row, padded with vocab_size (which the op never counts)."""
        width = max(int(lengths.max(initial=0)), 1)
        cols = starts[:, None] + np.arange(width)
        valid = np.arange(width) < lengths[:, None]
        cols = np.minimum(cols, all_token_ids.shape[1] - 1)
        device = all_token_ids.device
        ids = all_token_ids[
            torch.from_numpy(rows).to(device)[:, None], torch.from_numpy(cols).to(device)
        ].to(torch.int64)
        return ids.masked_fill_(~torch.from_numpy(valid).to(device), self.vocab_size)
