"""The Model Runner V2 sampler (upstream: vllm/v1/worker/gpu/sample/sampler.py).

Order of operations (the V1 sampler's):
  1. logits -> float32
  2. allowed_token_ids, bad words, min_tokens, logit bias (logit_bias.py,
     bad_words.py), then repetition/frequency/presence penalties
     (penalties.py): edits that may change the argmax, so greedy rows get them
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
from vllm.v1.worker.gpu.sample.bad_words import BadWordsState
from vllm.v1.worker.gpu.sample.greedy_argmax import argmax_rows
from vllm.v1.worker.gpu.sample.gumbel import apply_temperature, gumbel_sample
from vllm.v1.worker.gpu.sample.logit_bias import LogitBiasState
from vllm.v1.worker.gpu.sample.logprob import compute_topk_logprobs
from vllm.v1.worker.gpu.sample.min_p import apply_min_p
from vllm.v1.worker.gpu.sample.penalties import PenaltiesState
from vllm.v1.worker.gpu.sample.states import NO_LOGPROBS, SamplingStates


class Sampler:
    """Samples one token per logits row from per-request parameters."""

    def __init__(
        self,
        max_num_reqs: int,
        vocab_size: int,
        device: torch.device,
        logprobs_mode: str = "raw_logprobs",
        seed: int | None = None,
    ) -> None:
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(
                f"Unknown logprobs_mode {logprobs_mode!r}; expected one of {LOGPROBS_MODES}."
            )
        self.logprobs_mode = logprobs_mode
        # `seed` makes the seeds drawn for unseeded requests reproducible.
        self.sampling_states = SamplingStates(
            max_num_reqs, vocab_size, device, seed_rng=np.random.default_rng(seed)
        )
        self.logit_bias_state = LogitBiasState(max_num_reqs, vocab_size, device)
        self.bad_words_state = BadWordsState(max_num_reqs)
        self.penalties_state = PenaltiesState(max_num_reqs, vocab_size, device)

    def add_request(self, req_idx: int, prompt_len: int, sampling_params: SamplingParams) -> None:
        self.sampling_states.add_request(req_idx, sampling_params)
        self.logit_bias_state.add_request(req_idx, prompt_len, sampling_params)
        self.bad_words_state.add_request(req_idx, prompt_len, sampling_params)
        self.penalties_state.add_request(req_idx, prompt_len, sampling_params)

    def apply_staged_writes(self) -> None:
        self.sampling_states.apply_staged_writes()

    def __call__(
        self,
        logits: torch.Tensor,
        idx_mapping: torch.Tensor,
        idx_mapping_np: np.ndarray,
        pos: torch.Tensor,
        seq_lens_np: np.ndarray | None = None,
        all_token_ids: torch.Tensor | None = None,
    ) -> SamplerOutput:
        """logits [n, vocab] (row i belongs to request row idx_mapping[i], and
        was computed at position pos[i]) -> SamplerOutput with
        sampled_token_ids [n, 1] int64.

        The edits of step 2 read each row's tokens: `seq_lens_np` [n] (tokens
        known per row: prompt + outputs so far) and the request rows'
        `all_token_ids`; without them no edit is applied.
        """
        states = self.sampling_states
        max_num_logprobs = states.max_num_logprobs(idx_mapping_np)
        edits = seq_lens_np is not None and self.any_edits(idx_mapping_np, seq_lens_np)
        if not edits and max_num_logprobs == NO_LOGPROBS and states.is_greedy(idx_mapping_np).all():
            # Nothing to process: temperature 0 leaves the argmax.
            return SamplerOutput(
                sampled_token_ids=argmax_rows(logits).view(-1, 1), logprobs_tensors=None
            )
        want_raw = max_num_logprobs != NO_LOGPROBS and self.logprobs_mode.startswith("raw")
        raw = logits
        logits = logits.to(torch.float32, copy=want_raw)
        if edits:
            assert seq_lens_np is not None and all_token_ids is not None
            self.apply_logits_edits(logits, idx_mapping_np, seq_lens_np, all_token_ids)
        sampled, processed = self.sample(logits, idx_mapping, idx_mapping_np, pos)

        logprobs_tensors = None
        if max_num_logprobs != NO_LOGPROBS:
            source = raw.to(torch.float32) if want_raw else processed
            logprobs_tensors = compute_topk_logprobs(
                source,
                max_num_logprobs,
                sampled,
                as_logprobs=self.logprobs_mode.endswith("logprobs"),
            )
        return SamplerOutput(
            sampled_token_ids=sampled.view(-1, 1), logprobs_tensors=logprobs_tensors
        )

    def any_edits(self, idx_mapping_np: np.ndarray, seq_lens_np: np.ndarray) -> bool:
        return (
            self.logit_bias_state.any_active(idx_mapping_np, seq_lens_np)
            or self.bad_words_state.any_active(idx_mapping_np)
            or self.penalties_state.any_active(idx_mapping_np)
        )

    def apply_logits_edits(
        self,
        logits: torch.Tensor,
        idx_mapping_np: np.ndarray,
        seq_lens_np: np.ndarray,
        all_token_ids: torch.Tensor,
    ) -> None:
        """Step 2, in place, in upstream's order."""
        self.logit_bias_state.apply_allowed_token_ids(logits, idx_mapping_np)
        self.bad_words_state.apply_bad_words(logits, idx_mapping_np, seq_lens_np, all_token_ids)
        self.logit_bias_state.apply_min_tokens_and_bias(logits, idx_mapping_np, seq_lens_np)
        self.penalties_state.apply_penalties(logits, idx_mapping_np, seq_lens_np, all_token_ids)

    def sample(
        self,
        logits: torch.Tensor,
        idx_mapping: torch.Tensor,
        idx_mapping_np: np.ndarray,
        pos: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Process `logits` (float32, modified in place) and sample; returns
        (token ids [n] int64, the processed logits)."""
        states = self.sampling_states
        logits = self.process_logits(logits, idx_mapping, idx_mapping_np)
        sampled = gumbel_sample(
            logits,
            idx_mapping,
            states.temperature.gpu,
            states.seeds.gpu,
            pos,
            states.is_greedy(idx_mapping_np),
        )
        return sampled, logits

    def process_logits(
        self, logits: torch.Tensor, idx_mapping: torch.Tensor, idx_mapping_np: np.ndarray
    ) -> torch.Tensor:
        """Step 3 (float32 `logits`, in place where the ops allow): temperature,
        min-p, top-k/top-p; returns the processed logits. Rows may repeat a
        request (speculative decoding: one row per draft position)."""
        states = self.sampling_states
        if states.needs_temperature(idx_mapping_np):
            apply_temperature(logits, idx_mapping, states.temperature.gpu)
        if states.do_min_p(idx_mapping_np):
            min_p_rows = np.flatnonzero(states.min_p.np[idx_mapping_np] > 0.0)
            apply_min_p(logits, idx_mapping, states.min_p.gpu, min_p_rows)
        top_k = top_p = None
        rows = idx_mapping.to(torch.int64)
        if states.do_top_k(idx_mapping_np):
            top_k = states.top_k.gpu[rows]
        if states.do_top_p(idx_mapping_np):
            top_p = states.top_p.gpu[rows]
        if top_k is not None or top_p is not None:
            logits = apply_top_k_top_p(logits, top_k, top_p)
        return logits


def dummy_sample(logits: torch.Tensor, vocab_size: int, max_logprobs: int) -> None:
    """Warm-up / profiling: top-k/top-p, a Gumbel draw and the top logprobs of
    every row of `logits` [n, vocab], with throw-away parameters (temperature
    0.5, top-k min(50, vocab), top-p 0.9, seed 0); no sampling state is read
    or written. `max_logprobs` -1 means the whole vocabulary."""
    device = logits.device
    logits = logits.to(torch.float32)
    n = logits.shape[0]
    rows = torch.arange(n, device=device)
    logits = apply_top_k_top_p(
        logits.div_(0.5),
        torch.full((n,), min(50, vocab_size), device=device),
        torch.full((n,), 0.9, device=device),
    )
    sampled = gumbel_sample(
        logits,
        rows,
        torch.full((n,), 0.5, device=device),
        torch.zeros(n, dtype=torch.int64, device=device),
        torch.zeros(n, dtype=torch.int64, device=device),
    )
    compute_topk_logprobs(logits, vocab_size if max_logprobs == -1 else max_logprobs, sampled)
