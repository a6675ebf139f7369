"""The Model Runner V2 sampler (upstream: vllm/v1/worker/gpu/sample/sampler.py).

Order of operations:
  1. logits -> float32
  2. [not built, as in the V1 sampler: logit bias, allowed/bad words,
     min_tokens, repetition/frequency/presence penalties]
  3. / temperature (greedy rows untouched), min-p, top-k/top-p (the V1 ops)
  4. Gumbel-max: argmax for greedy rows, argmax(logits + Gumbel noise) for the
     rest, the noise keyed by (request seed, position) (see gumbel.py)
  5. the sampled token's logprob and rank plus the top-k logprobs, from the raw
     logits (raw_* modes, the default) or the processed ones (processed_*)

Parameters live in `SamplingStates` rows; a step reads them through the
batch's `idx_mapping`.
"""
from __future__ import annotations

import numpy as np
import torch

from vllm.sampling_params import SamplingParams
from vllm.v1.outputs import SamplerOutput
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
from vllm.v1.sample.sampler import LOGPROBS_MODES
from vllm.v1.worker.gpu.sample.greedy_argmax import argmax_rows
from vllm.v1.worker.gpu.sample.gumbel import apply_temperature, gumbel_sample
from vllm.v1.worker.gpu.sample.logprob import compute_topk_logprobs
from vllm.v1.worker.gpu.sample.min_p import apply_min_p
from vllm.v1.worker.gpu.sample.states import NO_LOGPROBS, SamplingStates


class Sampler:
    """Samples one token per logits row from per-request parameters."""

    def __init__(self, max_num_reqs: int, vocab_size: int, device: torch.device,
                 logprobs_mode: str = "raw_logprobs", seed: int | None = None) -> None:
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"Unknown logprobs_mode {logprobs_mode!r}; "
                             f"expected one of {LOGPROBS_MODES}.")
        self.logprobs_mode = logprobs_mode
        # `seed` makes the seeds drawn for unseeded requests reproducible.
        self.sampling_states = SamplingStates(max_num_reqs, vocab_size, device,
                                              seed_rng=np.random.default_rng(seed))

    def add_request(self, req_idx: int, sampling_params: SamplingParams) -> None:
        self.sampling_states.add_request(req_idx, sampling_params)

    def apply_staged_writes(self) -> None:
        self.sampling_states.apply_staged_writes()

    def __call__(self, logits: torch.Tensor, idx_mapping: torch.Tensor,
                 idx_mapping_np: np.ndarray, pos: torch.Tensor) -> SamplerOutput:
        """logits [n, vocab] (row i belongs to request row idx_mapping[i], and
        was computed at position pos[i]) -> SamplerOutput with
        sampled_token_ids [n, 1] int64."""
        states = self.sampling_states
        max_num_logprobs = states.max_num_logprobs(idx_mapping_np)
        if max_num_logprobs == NO_LOGPROBS and states.is_greedy(idx_mapping_np).all():
            # Nothing to process: temperature 0 leaves the argmax.
            return SamplerOutput(sampled_token_ids=argmax_rows(logits).view(-1, 1),
                                 logprobs_tensors=None)
        want_raw = max_num_logprobs != NO_LOGPROBS and self.logprobs_mode.startswith("raw")
        raw = logits
        logits = logits.to(torch.float32, copy=want_raw)
        sampled, processed = self.sample(logits, idx_mapping, idx_mapping_np, pos)

        logprobs_tensors = None
        if max_num_logprobs != NO_LOGPROBS:
            source = raw.to(torch.float32) if want_raw else processed
            logprobs_tensors = compute_topk_logprobs(
                source, max_num_logprobs, sampled,
                as_logprobs=self.logprobs_mode.endswith("logprobs"))
        return SamplerOutput(sampled_token_ids=sampled.view(-1, 1),
                             logprobs_tensors=logprobs_tensors)

    def sample(self, logits: torch.Tensor, idx_mapping: torch.Tensor,
               idx_mapping_np: np.ndarray, pos: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Process `logits` (float32, modified in place) and sample; returns
        (token ids [n] int64, the processed logits)."""
        states = self.sampling_states
        if states.needs_temperature(idx_mapping_np):
            apply_temperature(logits, idx_mapping, states.temperature.gpu)
        if states.do_min_p(idx_mapping_np):
            rows = np.flatnonzero(states.min_p.np[idx_mapping_np] > 0.0)
            apply_min_p(logits, idx_mapping, states.min_p.gpu, rows)
        top_k = top_p = None
        rows = idx_mapping.to(torch.int64)
        if states.do_top_k(idx_mapping_np):
            top_k = states.top_k.gpu[rows]
        if states.do_top_p(idx_mapping_np):
            top_p = states.top_p.gpu[rows]
        if top_k is not None or top_p is not None:
            logits = apply_top_k_top_p(logits, top_k, top_p)
        sampled = gumbel_sample(logits, idx_mapping, states.temperature.gpu,
                                states.seeds.gpu, pos, states.is_greedy(idx_mapping_np))
        return sampled, logits
