"""Verifies a step's draft tokens against the target model
(upstream: vllm/v1/sample/rejection_sampler.py; the algorithm of
https://arxiv.org/abs/2211.17192).

Per request, draft positions are checked in order until the first rejection:
- greedy rows: a draft is accepted while it equals the target's argmax; the
  first mismatch emits the target's argmax instead;
- random rows: a draft x is accepted with probability min(1, p(x) / q(x))
  (p: target, q: draft distribution; q is one-hot on the draft when the
  proposer gives no probabilities, e.g. ngram, so x is accepted with p(x));
  the first rejection emits a "recovered" token drawn from
  normalize(max(p - q, 0)), which makes every emitted token distributed as p;
- when every draft is accepted the bonus token (sampled from the target at the
  position after the last draft, by the ordinary Sampler) is appended.

The target distribution at each row is the ordinary Sampler's at that
position: allowed ids, bad words, logit_bias, min_tokens, penalties, then
temperature, min-p, top-k/top-p, with draft row j of request r following
r's outputs plus its drafts before j (vllm/v1/sample/ops/draft_positions.py);
the bonus row goes through the Sampler itself with the same rule (j = n_r).

Output: `sampled_token_ids` [batch_size, max_spec_len + 1] int32, each row the
request's accepted drafts, then the recovered or bonus token, then
PLACEHOLDER_TOKEN_ID. Everything is batched tensor ops over the
[batch_size, max_spec_len] grid; the only Python loops run over the seeded
requests' generators (and, with penalties / bad words, over the host lists
those ops already take).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from vllm.v1.outputs import LogprobsLists, LogprobsTensors, SamplerOutput
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.ops.bad_words import apply_bad_words
from vllm.v1.sample.ops.draft_positions import (
    PLACEHOLDER_TOKEN_ID,
    apply_logitsprocs_at_positions,
    assemble_output,
    bonus_histories,
    bonus_positions,
    count_accepted,
    draft_positions,
    grid_logits_rows,
    histories_with_drafts,
    repeat_indices,
)
from vllm.v1.sample.ops.penalties import apply_all_penalties
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
from vllm.v1.sample.sampler import Sampler
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

# Greedy rows hold a temperature below this (same test as Sampler).
_SAMPLING_EPS = 1e-5
# Most draft tokens one request may verify in one step (as upstream).
MAX_SPEC_LEN = 128


class RejectionSampler(nn.Module):
    """accepted tokens: drafts kept by the test above; recovered tokens: drawn
    from the residual at the first rejection; bonus tokens: sampled from the
    target when all drafts are accepted. output = accepted + recovered/bonus."""

    def __init__(
        self,
        sampler: Sampler,
        spec_config: Any | None = None,
        device: torch.device | None = None,
    ) -> None:
        super().__init__()
        self.sampler = sampler
        method = getattr(spec_config, "rejection_sample_method", None)
        if method not in (None, "standard"):
            # Upstream's "synthetic" mode (fixed acceptance rates, for benchmarks).
            raise NotImplementedError(
                f"rejection_sample_method={method!r} is not supported; use 'standard'."
            )
        # processed_*: logprobs of the distribution each token was verified
        # against / sampled from (after processors, penalties, temperature,
        # min-p, top-k/top-p), as the Sampler reports them.
        self.is_processed_logprobs_mode = sampler.logprobs_mode.startswith("processed")

    def forward(
        self,
        metadata: SpecDecodeMetadata,
        # [num_tokens, vocab_size] or None (ngram: no draft distribution)
        draft_probs: torch.Tensor | None,
        # [num_tokens + batch_size, vocab_size]
        logits: torch.Tensor,
        sampling_metadata: SamplingMetadata,
    ) -> SamplerOutput:
        if metadata.max_spec_len > MAX_SPEC_LEN:
            raise ValueError(
                f"max_spec_len {metadata.max_spec_len} exceeds MAX_SPEC_LEN {MAX_SPEC_LEN}."
            )
        md = sampling_metadata
        bonus_token_ids, bonus_processed = self._sample_bonus(logits, metadata, md)

        target_logits = logits.index_select(0, metadata.target_logits_indices.long()).to(
            torch.float32
        )
        target_logits = self.apply_logits_processors(target_logits, md, metadata)
        target_logits = apply_sampling_constraints(target_logits, metadata.num_draft_tokens, md)

        output_token_ids = rejection_sample(
            metadata.draft_token_ids,
            metadata.num_draft_tokens,
            metadata.max_spec_len,
            metadata.cu_num_draft_tokens,
            draft_probs,
            target_logits,
            bonus_token_ids,
            md,
        )
        logprobs_tensors = None
        if md.max_num_logprobs is not None:
            if self.is_processed_logprobs_mode:
                assert bonus_processed is not None
                logits = self._processed_rows(logits, metadata, target_logits, bonus_processed)
            logprobs_tensors = self._get_logprobs_tensors(
                md.max_num_logprobs, metadata, logits, output_token_ids
            )
        return SamplerOutput(sampled_token_ids=output_token_ids, logprobs_tensors=logprobs_tensors)

    def _sample_bonus(
        self, logits: torch.Tensor, metadata: SpecDecodeMetadata, md: SamplingMetadata
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """([batch, 1] int32, processed [batch, V] or None): the ordinary
        Sampler on each request's bonus row, which follows all its drafts:
        logit_bias / min_tokens are placed at position n_r here, penalties
        and bad words see outputs + drafts. `processed` (processed_* logprobs
        modes only) is what the Sampler would report for that row."""
        # index_select copies (and is much faster than logits[idx] on CPU),
        # so the rows can be edited in place.
        bonus_logits = logits.index_select(0, metadata.bonus_logits_indices.long())
        procs = md.logitsprocs
        changes: dict[str, Any] = {"max_num_logprobs": None}
        if procs.non_argmax_invariant:
            # Applied before the Sampler's allowed-ids mask and bad words
            # (both only set -inf, so the order does not matter), still
            # before the penalties as in the Sampler.
            req, pos = bonus_positions(metadata.num_draft_tokens, bonus_logits.device)
            bonus_logits = apply_logitsprocs_at_positions(
                bonus_logits.to(torch.float32), procs, req, pos
            )
            changes["logitsprocs"] = LogitsProcessors(procs.argmax_invariant)
        if (not md.no_penalties or md.bad_words_token_ids) and metadata.max_spec_len > 0:
            changes["output_token_ids"] = bonus_histories(md.output_token_ids, metadata)
        bonus_md = replace(md, **changes)
        # Sampler.forward without its logprobs: its processed rows are kept.
        bonus_logits = self.sampler.apply_logits_processors(
            bonus_logits.to(torch.float32), bonus_md
        )
        sampled, processed = self.sampler.sample(bonus_logits, bonus_md)
        return sampled.to(torch.int32).unsqueeze(-1), processed

    def _processed_rows(
        self,
        logits: torch.Tensor,  # [num_tokens + batch, V]: the layout of the grid rows
        metadata: SpecDecodeMetadata,
        target_logits: torch.Tensor,  # [num_tokens, V] processed
        bonus_processed: torch.Tensor,  # [batch, V] in the mode's form already
    ) -> torch.Tensor:
        """The processed values in the rows of `logits` (draft rows from the
        processed target logits, bonus rows from the Sampler), so the raw
        path below picks each cell's row; logprobs are already normalised."""
        rows = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
        if self.sampler.logprobs_mode == "processed_logprobs":
            target_logits = self.sampler.compute_logprobs(target_logits)
        rows.index_copy_(0, metadata.target_logits_indices.long(), target_logits)
        rows.index_copy_(0, metadata.bonus_logits_indices.long(), bonus_processed.float())
        return rows

    def _get_logprobs_tensors(
        self,
        max_num_logprobs: int,
        metadata: SpecDecodeMetadata,
        logits: torch.Tensor,
        output_token_ids: torch.Tensor,
    ) -> LogprobsTensors:
        """Logprobs for every cell of the [batch, max_spec_len + 1] output,
        flattened row-major; placeholder cells get token 0 and are dropped by
        parse_output. `logits`: raw, or the processed rows (already in the
        mode's form)."""
        width = output_token_ids.shape[1]
        rows = grid_logits_rows(metadata, width)  # [batch, width]
        cell_logits = logits.index_select(0, rows.flatten()).to(torch.float32)
        if self.sampler.logprobs_mode == "raw_logprobs":
            cell_logits = self.sampler.compute_logprobs(cell_logits)
        tokens = output_token_ids.flatten().to(torch.int64).clamp(min=0)
        return self.sampler.gather_logprobs(cell_logits, max_num_logprobs, tokens)

    @staticmethod
    def parse_output(
        output_token_ids: torch.Tensor,
        vocab_size: int,
        discard_req_indices: Sequence[int] = (),
        logprobs_tensors: LogprobsTensors | None = None,
    ) -> tuple[list[list[int]], LogprobsLists | None]:
        """Rows of [batch, max_spec_len + 1] -> each request's emitted tokens
        (placeholders and ids >= vocab_size dropped; discarded rows empty).
        The logprobs come back as one flat list over the kept tokens, request
        after request (counted before discarding), with
        `cu_num_generated_tokens` [batch + 1] marking where each request's
        positions start, so `LogprobsLists.slice_request(row, n)` finds them."""
        ids = output_token_ids.cpu().numpy()
        valid = (ids != PLACEHOLDER_TOKEN_ID) & (ids < vocab_size)
        out_logprobs = None
        if logprobs_tensors is not None:
            keep = torch.from_numpy(valid.flatten())
            cu_num_tokens = [0, *np.cumsum(valid.sum(axis=1)).tolist()]
            out_logprobs = LogprobsTensors(
                logprobs_tensors.logprob_token_ids.cpu()[keep],
                logprobs_tensors.logprobs.cpu()[keep],
                logprobs_tensors.selected_token_ranks.cpu()[keep],
            ).tolists(cu_num_tokens)
        if len(discard_req_indices) > 0:
            valid[np.asarray(discard_req_indices)] = False
        return [row[valid[i]].tolist() for i, row in enumerate(ids)], out_logprobs

    def apply_logits_processors(
        self,
        logits: torch.Tensor,
        sampling_metadata: SamplingMetadata,
        metadata: SpecDecodeMetadata,
    ) -> torch.Tensor:
        """The argmax-changing edits for each draft row, in the Sampler's
        order (allowed ids, bad words, logits processors, penalties). Row t
        belongs to request r(t) at draft position j(t); its history is r's
        outputs plus r's drafts before j(t) (see ops/draft_positions.py)."""
        md = sampling_metadata
        if (
            md.allowed_token_ids_mask is None
            and md.no_penalties
            and not md.bad_words_token_ids
            and not md.logitsprocs.non_argmax_invariant
        ):
            return logits
        req, pos = draft_positions(metadata.num_draft_tokens, logits.device)
        if md.allowed_token_ids_mask is not None:
            logits.masked_fill_(md.allowed_token_ids_mask[req], float("-inf"))
        history: list[list[int]] | None = None
        if md.bad_words_token_ids:
            history = histories_with_drafts(md.output_token_ids, metadata)
            req_list = req.tolist()
            bad = {
                t: md.bad_words_token_ids[r]
                for t, r in enumerate(req_list)
                if r in md.bad_words_token_ids
            }
            apply_bad_words(logits, bad, history)
        logits = apply_logitsprocs_at_positions(logits, md.logitsprocs, req, pos)
        if not md.no_penalties:
            assert md.prompt_token_ids is not None
            assert md.presence_penalties is not None
            assert md.frequency_penalties is not None
            assert md.repetition_penalties is not None
            if history is None:
                history = histories_with_drafts(md.output_token_ids, metadata)
            logits = apply_all_penalties(
                logits,
                md.prompt_token_ids[req],
                md.presence_penalties[req],
                md.frequency_penalties[req],
                md.repetition_penalties[req],
                history,
            )
        return logits


def apply_sampling_constraints(
    logits: torch.Tensor,  # [num_tokens, vocab_size] float32, edited in place
    num_draft_tokens: list[int],
    sampling_metadata: SamplingMetadata,
) -> torch.Tensor:
    """Temperature, min-p, top-k and top-p of each position's request: the
    target distribution random rows are verified against. Greedy batches are
    returned unchanged; greedy rows of a mixed batch divide by 1."""
    md = sampling_metadata
    if md.all_greedy:
        return logits
    assert md.temperature is not None
    repeat = repeat_indices(num_draft_tokens, logits.device)
    temperature = md.temperature[repeat]
    temperature = torch.where(temperature < _SAMPLING_EPS, 1.0, temperature)
    logits.div_(temperature.unsqueeze(1))
    if md.min_p is not None:
        logits = Sampler.apply_min_p(logits, md.min_p[repeat])
    top_k = None if md.top_k is None else md.top_k[repeat]
    top_p = None if md.top_p is None else md.top_p[repeat]
    return apply_top_k_top_p(logits, top_k, top_p)


def generate_uniform_probs(
    num_tokens: int,
    num_draft_tokens: list[int],
    generators: dict[int, torch.Generator],
    device: torch.device,
) -> torch.Tensor:
    """[num_tokens] float64 uniforms (float64: float32 rand can return an
    exact 0.0). Seeded requests with drafts draw theirs from their generator."""
    uniform = torch.rand((num_tokens,), dtype=torch.float64, device=device)
    starts = np.cumsum([0, *num_draft_tokens])
    for req, gen in generators.items():
        n = num_draft_tokens[req]
        if n > 0:  # no draw for requests without drafts: keeps seeds reproducible
            uniform[starts[req] : starts[req] + n].uniform_(generator=gen)
    return uniform


def sample_recovered_tokens(
    rows: torch.Tensor,  # [R] draft positions (flat indices) that were rejected
    reqs: torch.Tensor,  # [R] their requests
    draft_token_ids: torch.Tensor,  # [num_tokens]
    draft_probs: torch.Tensor | None,  # [num_tokens, vocab]
    target_probs: torch.Tensor,  # [num_tokens, vocab]
    generators: dict[int, torch.Generator],
) -> torch.Tensor:
    """[R]: a draw from normalize(max(p - q, 0)) at each given position, by the
    exponential race argmax(residual / E), E ~ Exp(1) (no need to normalise).
    Only a request's first rejected position emits its draw, so only those
    rows are computed (upstream computes every position and discards the
    rest). Seeded requests draw E from their generator."""
    probs = target_probs.index_select(0, rows)  # a copy: edited in place below
    if draft_probs is None:
        # q is one-hot on the draft: the residual is p without the draft token.
        drafts = draft_token_ids[rows].long().clamp(min=0).unsqueeze(1)
        residual = probs.scatter_(1, drafts, 0.0)
    else:
        residual = probs.sub_(draft_probs.index_select(0, rows)).clamp_(min=0.0)
    # E = -log(U), U ~ U[0, 1): several times faster than exponential_ on
    # CPU; U = 0 gives E = inf, a zero score, never a NaN.
    uniform = torch.rand_like(residual)
    if generators:
        for i, req in enumerate(reqs.tolist()):
            if req in generators:
                uniform[i].uniform_(generator=generators[req])
    exp = uniform.log_().neg_()
    return residual.div_(exp).argmax(dim=-1)


def rejection_sample(
    draft_token_ids: torch.Tensor,  # [num_tokens]
    num_draft_tokens: list[int],  # [batch_size]
    max_spec_len: int,
    cu_num_draft_tokens: torch.Tensor,  # [batch_size]
    draft_probs: torch.Tensor | None,  # [num_tokens, vocab_size]
    target_logits: torch.Tensor,  # [num_tokens, vocab_size], processed
    bonus_token_ids: torch.Tensor,  # [batch_size, 1]
    sampling_metadata: SamplingMetadata,
) -> torch.Tensor:
    """[batch_size, max_spec_len + 1] int32 output (see the module doc)."""
    md = sampling_metadata
    num_tokens = draft_token_ids.shape[0]
    device = target_logits.device
    assert target_logits.shape[0] == num_tokens
    assert draft_probs is None or draft_probs.shape == target_logits.shape

    draft = draft_token_ids.long()
    # Per position: is the draft accepted, and what replaces it if not.
    target_argmax = target_logits.argmax(dim=-1)
    accepted = draft == target_argmax
    replacement = target_argmax
    random_rows: torch.Tensor | None = None  # [batch] bool
    if not md.all_greedy:
        uniform = generate_uniform_probs(num_tokens, num_draft_tokens, md.generators, device)
        safe = draft.clamp(min=0).unsqueeze(1)
        target_probs = target_logits.softmax(dim=-1, dtype=torch.float32)
        p = target_probs.gather(1, safe).squeeze(1).double()
        if draft_probs is None:
            q = torch.ones_like(p)
        else:
            q = draft_probs.gather(1, safe).squeeze(1).double()
        # Accept when u <= p / q (q == 0 would be a proposer bug: reject).
        rand_accepted = (q > 0) & (p >= uniform * q) & (draft >= 0)
        if md.all_random:
            accepted = rand_accepted
            random_rows = torch.ones(len(num_draft_tokens), dtype=torch.bool, device=device)
        else:
            assert md.temperature is not None
            random_rows = md.temperature >= _SAMPLING_EPS
            per_token = random_rows[repeat_indices(num_draft_tokens, device)]
            accepted = torch.where(per_token, rand_accepted, accepted)
    n = torch.tensor(num_draft_tokens, dtype=torch.long, device=device)
    start = cu_num_draft_tokens.long() - n
    num_accepted = count_accepted(accepted, n, start, max_spec_len)
    if random_rows is not None:
        # The first rejected position of each random request gets a recovered token.
        reqs = torch.nonzero(random_rows & (num_accepted < n)).squeeze(1)
        if reqs.numel() > 0:
            rows = start[reqs] + num_accepted[reqs]
            recovered = sample_recovered_tokens(
                rows, reqs, draft_token_ids, draft_probs, target_probs, md.generators
            )
            replacement = target_argmax.clone()
            replacement[rows] = recovered.to(replacement.dtype)
    return assemble_output(
        draft, replacement, bonus_token_ids, n, start, num_accepted, max_spec_len
    )
