"""allowed_token_ids, min_tokens and logit_bias for Model Runner V2
(upstream: vllm/v1/worker/gpu/sample/logit_bias.py).

Few requests use these, so the state is sparse: per request row, the
allowed ids, the stop ids to forbid and the bias, as device tensors made once
when the request arrives. A step edits only the batch rows that have any (a
host-side flag per row says which), with one or two indexed writes each.

min_tokens needs the number of tokens a request has generated so far: the
sampled token lands at position seq_len, so that number is seq_len -
prompt_len, which the host knows without reading the device.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm.sampling_params import SamplingParams


class LogitBiasState:
    def __init__(self, max_num_reqs: int, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.prompt_len = np.zeros(max_num_reqs, dtype=np.int32)
        self.has_allowed = np.zeros(max_num_reqs, dtype=bool)
        self.has_bias = np.zeros(max_num_reqs, dtype=bool)
        self.min_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self.allowed_ids: dict[int, torch.Tensor] = {}
        self.bias: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.stop_ids: dict[int, torch.Tensor] = {}

    def _ids(self, ids) -> torch.Tensor:
        ids = [t for t in ids if 0 <= t < self.vocab_size]
        return torch.tensor(ids, dtype=torch.int64).to(self.device)

    def add_request(self, req_idx: int, prompt_len: int, params: SamplingParams) -> None:
        self.prompt_len[req_idx] = prompt_len
        allowed = params.allowed_token_ids
        self.has_allowed[req_idx] = bool(allowed)
        if allowed:
            self.allowed_ids[req_idx] = self._ids(allowed)
        bias = {t: b for t, b in (params.logit_bias or {}).items() if 0 <= t < self.vocab_size}
        self.has_bias[req_idx] = bool(bias)
        if bias:
            self.bias[req_idx] = (
                self._ids(bias),
                torch.tensor(list(bias.values()), dtype=torch.float32, device=self.device),
            )
        stop_ids = params.all_stop_token_ids if params.min_tokens else ()
        self.min_tokens[req_idx] = params.min_tokens if stop_ids else 0
        if stop_ids:
            self.stop_ids[req_idx] = self._ids(sorted(stop_ids))

    def apply_allowed_token_ids(self, logits: torch.Tensor, idx_mapping_np: np.ndarray) -> None:
        """Every token outside a row's allowed_token_ids -> -inf, in place."""
        for i in np.flatnonzero(self.has_allowed[idx_mapping_np]).tolist():
            allowed = self.allowed_ids[int(idx_mapping_np[i])]
            kept = logits[i, allowed]
            logits[i].fill_(float("-inf"))
            logits[i, allowed] = kept

    def apply_min_tokens_and_bias(
        self, logits: torch.Tensor, idx_mapping_np: np.ndarray, seq_lens_np: np.ndarray
    ) -> None:
        """Forbid the stop tokens of rows with fewer than min_tokens outputs,
        then add the logit bias, in place (upstream's order)."""
        for i in np.flatnonzero(self._below_min_tokens(idx_mapping_np, seq_lens_np)).tolist():
            logits[i, self.stop_ids[int(idx_mapping_np[i])]] = float("-inf")
        for i in np.flatnonzero(self.has_bias[idx_mapping_np]).tolist():
            ids, values = self.bias[int(idx_mapping_np[i])]
            logits[i].index_add_(0, ids, values.to(logits.dtype))

    def _below_min_tokens(self, idx_mapping_np: np.ndarray, seq_lens_np: np.ndarray) -> np.ndarray:
        min_tokens = self.min_tokens[idx_mapping_np]
        num_outputs = seq_lens_np - self.prompt_len[idx_mapping_np]
        return (min_tokens > 0) & (num_outputs < min_tokens)

    def any_active(self, idx_mapping_np: np.ndarray, seq_lens_np: np.ndarray) -> bool:
        rows = idx_mapping_np
        return bool(
            self.has_allowed[rows].any()
            or self.has_bias[rows].any()
            or self._below_min_tokens(rows, seq_lens_np).any()
        )
