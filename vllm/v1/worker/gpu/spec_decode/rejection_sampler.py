"""Verification of draft tokens on Model Runner V2 (upstream:
vllm/v1/worker/gpu/spec_decode/rejection_sampler.py `RejectionSampler`).

Layout: request i of the batch owns logits rows cu_num_logits[i] ..
cu_num_logits[i+1]-1: one row per draft token (row j is computed at the
position the draft d_{j+1} will take, so it scores d_{j+1}), then the bonus
row. The draft scored by row r is the next row's input token,
`input_ids[logits_indices[r] + 1]`.

Per draft row, in order, while every earlier draft was accepted:
- greedy request (temperature 0): accept iff d == argmax(target row);
- random request: accept iff p(d) > u, p the target distribution after every
  sampling parameter (the V2 Sampler's processing), u uniform in (0, 1).
  Drafts here are greedy (one-hot proposals q = delta(d)), so this is the
  standard test p(d) / q(d) > u; upstream compares log p(d) > log u + log q(d).
The first rejected row emits a token drawn from the residual max(p - q, 0),
i.e. p with d removed (greedy: the argmax); a request whose drafts were all
accepted emits the bonus row's ordinary sample. So each emitted token is
distributed exactly as the ordinary Sampler's at that position.

Randomness is V2's: u and the Gumbel noise are keyed by (request seed,
position) (gumbel.py `row_keys`), so a seeded request verifies and samples
identically whatever its batch-mates, as without speculation.

Sampling parameters that read the tokens so far (penalties, bad words,
min_tokens, logit bias) see, at draft row j, the outputs plus the drafts
before it: the drafts are written into the request's `all_token_ids` row past
its known tokens (harmless: the emitted tokens overwrite them, and nothing
reads past a request's length).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from vllm.v1.outputs import LogprobsTensors, SamplerOutput
from vllm.v1.worker.gpu.input_batch import get_num_sampled_and_rejected
from vllm.v1.worker.gpu.sample.greedy_argmax import argmax_rows
from vllm.v1.worker.gpu.sample.gumbel import _as_int32, _Int32Hasher, gumbel_sample, row_keys
from vllm.v1.worker.gpu.sample.logprob import compute_topk_logprobs
from vllm.v1.worker.gpu.sample.states import NO_LOGPROBS

if TYPE_CHECKING:
    from vllm.v1.worker.gpu.input_batch import InputBatch
    from vllm.v1.worker.gpu.sample.sampler import Sampler

# Salt that separates the acceptance uniform of a row from its Gumbel noise
# (which hashes v * 0x9E3779B9 + key): any odd constant not used there.
_ACCEPT_SALT = 0x2545F491


def acceptance_uniforms(seeds: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """[n] float32 uniforms in (0, 1), one per (seed, position): the top 23
    bits of fmix32(row_key ^ salt), centred in their interval (never 0 or 1)."""
    h = row_keys(seeds, pos).bitwise_xor_(_as_int32(_ACCEPT_SALT))
    _Int32Hasher.fmix32_(h, torch.empty_like(h))
    k = torch.bitwise_right_shift(h, 9).bitwise_and_(0x7FFFFF)
    return (k.to(torch.float32) + 0.5) * 2.0**-23


@dataclass
class VerifyLayout:
    """Host-side description of a step's logits rows (see the module docstring)."""

    req_of_row: np.ndarray  # [L] batch position of each logits row
    local_pos: np.ndarray  # [L] index of the row among its request's rows
    is_bonus: np.ndarray  # [L] the request's last row
    expanded_idx_np: np.ndarray  # [L] request row (RequestState) of each logits row
    seq_lens: np.ndarray  # [L] tokens known when the row is sampled (position + 1)

    @classmethod
    def from_batch(cls, batch: InputBatch) -> VerifyLayout:
        cu = batch.cu_num_logits_np.astype(np.int64)
        counts = np.diff(cu)
        num_logits = int(cu[-1])
        req_of_row = np.repeat(np.arange(batch.num_reqs), counts)
        local_pos = np.arange(num_logits) - cu[:-1][req_of_row]
        is_bonus = local_pos == counts[req_of_row] - 1
        # Row j of a request whose last row sits at position seq_len - 1.
        seq_lens = batch.seq_lens_np[req_of_row] - (counts[req_of_row] - 1 - local_pos)
        return cls(req_of_row, local_pos, is_bonus, batch.idx_mapping_np[req_of_row], seq_lens)


class RejectionSampler:
    """Verifies a step's drafts against the target's logits (V2 sampling)."""

    def __init__(self, sampler: Sampler, num_speculative_steps: int) -> None:
        self.sampler = sampler
        self.num_speculative_steps = num_speculative_steps

    def __call__(
        self,
        logits: torch.Tensor,
        batch: InputBatch,
        all_token_ids: torch.Tensor,
        prefill_len: torch.Tensor,
    ) -> tuple[SamplerOutput, torch.Tensor, torch.Tensor]:
        """The runner's entry: (SamplerOutput, tokens emitted [num_reqs],
        drafts rejected [num_reqs]), both 0 for a request still mid-prefill
        (`get_num_sampled_and_rejected`; prefill_len per request row)."""
        sampled, num_sampled, logprobs = self.verify(logits, batch, all_token_ids)
        num_sampled, num_rejected = get_num_sampled_and_rejected(
            num_sampled, batch.seq_lens, batch.cu_num_logits, batch.idx_mapping, prefill_len
        )
        return SamplerOutput(sampled, logprobs), num_sampled, num_rejected

    @torch.inference_mode()
    def verify(
        self, logits: torch.Tensor, batch: InputBatch, all_token_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, LogprobsTensors | None]:
        """logits [L, vocab] -> (sampled [num_reqs, k + 1] int64, -1 padded;
        num_sampled [num_reqs] int32 (accepted drafts + 1); the logprobs of
        every logits row's emitted token, or None)."""
        layout = VerifyLayout.from_batch(batch)
        device = logits.device
        states = self.sampler.sampling_states
        pos = batch.positions[batch.logits_indices]
        expanded_idx = batch.expanded_idx_mapping
        drafts = self._draft_tokens(batch, layout)
        self._stage_drafts(all_token_ids, expanded_idx, pos, drafts, layout)

        max_num_logprobs = states.max_num_logprobs(batch.idx_mapping_np)
        raw = logits
        processed = logits.to(torch.float32, copy=True)
        if self.sampler.any_edits(layout.expanded_idx_np, layout.seq_lens):
            self.sampler.apply_logits_edits(
                processed, layout.expanded_idx_np, layout.seq_lens, all_token_ids
            )
        processed = self.sampler.process_logits(processed, expanded_idx, layout.expanded_idx_np)

        is_greedy_np = states.is_greedy(layout.expanded_idx_np)
        accepted = self._accept(processed, drafts, expanded_idx, pos, is_greedy_np, layout)
        # The token emitted where a request stops: the bonus row's sample, or
        # a draw from the target without the rejected draft (greedy: argmax).
        masked = processed
        draft_rows = np.flatnonzero(~layout.is_bonus)
        if draft_rows.size:
            masked = processed.clone()
            rows_t = torch.from_numpy(draft_rows).to(device)
            masked[rows_t, drafts[rows_t]] = float("-inf")
        recovered = gumbel_sample(
            masked, expanded_idx, states.temperature.gpu, states.seeds.gpu, pos, is_greedy_np
        )
        sampled, num_sampled = self._assemble(drafts, accepted, recovered, layout, batch.num_reqs)

        logprobs = None
        if max_num_logprobs != NO_LOGPROBS:
            mode = self.sampler.logprobs_mode
            source = raw.to(torch.float32) if mode.startswith("raw") else processed
            req_t = torch.from_numpy(layout.req_of_row).to(device)
            local_t = torch.from_numpy(layout.local_pos).to(device)
            row_tokens = sampled[req_t, local_t].clamp_(min=0)
            logprobs = compute_topk_logprobs(
                source, max_num_logprobs, row_tokens, as_logprobs=mode.endswith("logprobs")
            )
        return sampled, num_sampled, logprobs

    @staticmethod
    def _draft_tokens(batch: InputBatch, layout: VerifyLayout) -> torch.Tensor:
        """[L] int64: the draft each row scores (-1 on bonus rows)."""
        next_index = (batch.logits_indices + 1).clamp_(max=batch.num_tokens - 1)
        drafts = batch.input_ids[next_index].to(torch.int64)
        bonus = torch.from_numpy(layout.is_bonus).to(drafts.device)
        return drafts.masked_fill_(bonus, -1)

    @staticmethod
    def _stage_drafts(
        all_token_ids: torch.Tensor,
        expanded_idx: torch.Tensor,
        pos: torch.Tensor,
        drafts: torch.Tensor,
        layout: VerifyLayout,
    ) -> None:
        """all_token_ids[row, pos + 1] = the draft scored at pos, for draft rows."""
        sel_np = np.flatnonzero(~layout.is_bonus)
        if sel_np.size == 0:
            return
        sel = torch.from_numpy(sel_np).to(drafts.device)
        rows = expanded_idx.to(torch.int64)[sel]
        all_token_ids[rows, pos[sel] + 1] = drafts[sel].to(all_token_ids.dtype)

    def _accept(
        self,
        processed: torch.Tensor,
        drafts: torch.Tensor,
        expanded_idx: torch.Tensor,
        pos: torch.Tensor,
        is_greedy_np: np.ndarray,
        layout: VerifyLayout,
    ) -> torch.Tensor:
        """[L] bool: whether each row accepts its draft (False on bonus rows),
        ignoring earlier rows (`_assemble` keeps the leading run)."""
        device = processed.device
        safe = drafts.clamp(min=0).unsqueeze(1)
        greedy = torch.from_numpy(is_greedy_np).to(device)
        accept = argmax_rows(processed) == drafts
        if not is_greedy_np.all():
            states = self.sampler.sampling_states
            seeds = states.seeds.gpu[expanded_idx.to(torch.int64)]
            # p(d) from the processed logits (temperature, top-k/p, min-p applied).
            log_p = processed.gather(1, safe)[:, 0] - torch.logsumexp(processed, dim=-1)
            u = acceptance_uniforms(seeds, pos)
            accept = torch.where(greedy, accept, log_p.exp() > u)
        return accept & (drafts >= 0)

    def _assemble(
        self,
        drafts: torch.Tensor,
        accepted: torch.Tensor,
        recovered: torch.Tensor,
        layout: VerifyLayout,
        num_reqs: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per request: its accepted drafts (the leading run), then the
        recovered/bonus token of the first row that did not accept."""
        device = drafts.device
        width = self.num_speculative_steps + 1
        req = torch.from_numpy(layout.req_of_row).to(device)
        local = torch.from_numpy(layout.local_pos).to(device)
        acc = torch.zeros(num_reqs, width, dtype=torch.int32, device=device)
        acc[req, local] = accepted.to(torch.int32)
        num_accepted = acc.cumprod(dim=1).sum(dim=1)  # leading accepts
        draft_mat = torch.full((num_reqs, width), -1, dtype=torch.int64, device=device)
        draft_mat[req, local] = drafts
        rec_mat = torch.full((num_reqs, width), -1, dtype=torch.int64, device=device)
        rec_mat[req, local] = recovered
        cols = torch.arange(width, device=device).unsqueeze(0)
        stop = num_accepted.unsqueeze(1)
        sampled = torch.where(
            cols < stop, draft_mat, torch.where(cols == stop, rec_mat, torch.full_like(rec_mat, -1))
        )
        return sampled, (num_accepted + 1).to(torch.int32)
