"""Bad words for Model Runner V2 (upstream: vllm/v1/worker/gpu/sample/bad_words.py).

A request's last output tokens live on the device (`all_token_ids`), so the
rows with bad words read their last `longest word - 1` output tokens back
(a device sync on CUDA, paid only by those rows) and the V1 op masks the
banned last tokens.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm.sampling_params import SamplingParams
from vllm.v1.sample.ops.bad_words import apply_bad_words


class BadWordsState:
    def __init__(self, max_num_reqs: int) -> None:
        self.prompt_len = np.zeros(max_num_reqs, dtype=np.int32)
        self.has_bad_words = np.zeros(max_num_reqs, dtype=bool)
        self.words: dict[int, list[list[int]]] = {}

    def add_request(self, req_idx: int, prompt_len: int, params: SamplingParams) -> None:
        self.prompt_len[req_idx] = prompt_len
        words = params.bad_words_token_ids
        self.has_bad_words[req_idx] = bool(words)
        if words:
            self.words[req_idx] = words

    def any_active(self, idx_mapping_np: np.ndarray) -> bool:
        return bool(self.has_bad_words[idx_mapping_np].any())

    def apply_bad_words(
        self,
        logits: torch.Tensor,
        idx_mapping_np: np.ndarray,
        seq_lens_np: np.ndarray,
        all_token_ids: torch.Tensor,
    ) -> None:
        sel = np.flatnonzero(self.has_bad_words[idx_mapping_np]).tolist()
        if not sel:
            return
        words: dict[int, list[list[int]]] = {}
        past: list[list[int]] = [[] for _ in range(logits.shape[0])]
        for i in sel:
            row = int(idx_mapping_np[i])
            words[i] = self.words[row]
            longest_prefix = max(len(w) for w in words[i]) - 1
            end = int(seq_lens_np[i])
            start = max(int(self.prompt_len[row]), end - longest_prefix)
            if end > start:
                past[i] = all_token_ids[row, start:end].tolist()
        apply_bad_words(logits, words, past)
