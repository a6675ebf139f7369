"""N-gram (prompt lookup) drafter (upstream: vllm/v1/spec_decode/ngram_proposer.py).

Rule (upstream v0.28's): for a request whose context is ``t[0:L]``, find the largest
``n`` in ``[prompt_lookup_min, prompt_lookup_max]`` such that the suffix ``t[L-n:L]``
also occurs at an earlier start ``s`` with at least one token after it
(``s + n <= L - 1``; occurrences may overlap the suffix). Among the occurrences of
that longest ``n``, the EARLIEST ``s`` wins. The draft is the tokens that follow it,
``t[s+n : s+n+k']``, with ``k' = min(k, max_model_len - L)`` and cut at ``L``.

Upstream scans each request with a numba-compiled KMP loop. Here the whole batch is
one vectorised numpy pass (no per-token Python loop): the requests' contexts are
concatenated into one flat array; each position ``e`` is a candidate END of an earlier
occurrence, and shifted comparisons count how many of the suffix's last tokens match
the tokens ending at ``e``: one full comparison pass,
then only the positions still matching are extended (O(total tokens) plus the
candidates times prompt_lookup_max), with no padding to the longest request.

Not wired into the engine yet: ``SpeculativeConfig`` still refuses speculation.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class _SpecConfigLike(Protocol):
    prompt_lookup_min: int | None
    prompt_lookup_max: int | None
    num_speculative_tokens: int | None


class _ModelConfigLike(Protocol):
    max_model_len: int


class _SchedulerConfigLike(Protocol):
    max_num_seqs: int


class NgramVllmConfigLike(Protocol):
    """What ``NgramProposer(vllm_config)`` reads (upstream passes a ``VllmConfig``)."""

    @property
    def speculative_config(self) -> _SpecConfigLike | None: ...

    @property
    def model_config(self) -> _ModelConfigLike: ...

    @property
    def scheduler_config(self) -> _SchedulerConfigLike: ...


class NgramProposer:
    """Drafts up to ``k`` tokens per request by prompt lookup."""

    def __init__(self, vllm_config: NgramVllmConfigLike):
        spec = vllm_config.speculative_config
        if spec is None:
            raise ValueError("NgramProposer needs vllm_config.speculative_config (method 'ngram')")
        if spec.prompt_lookup_min is None or spec.prompt_lookup_max is None:
            raise ValueError(
                "NgramProposer needs prompt_lookup_min and prompt_lookup_max to be set"
            )
        if spec.num_speculative_tokens is None:
            raise ValueError("NgramProposer needs num_speculative_tokens to be set")
        self._setup(
            prompt_lookup_min=spec.prompt_lookup_min,
            prompt_lookup_max=spec.prompt_lookup_max,
            num_speculative_tokens=spec.num_speculative_tokens,
            max_model_len=vllm_config.model_config.max_model_len,
            max_num_seqs=vllm_config.scheduler_config.max_num_seqs,
        )

    @classmethod
    def from_params(
        cls,
        prompt_lookup_min: int,
        prompt_lookup_max: int,
        num_speculative_tokens: int,
        max_model_len: int,
        max_num_seqs: int = 128,
    ) -> NgramProposer:
        """Build from the numbers alone (no config object)."""
        self = cls.__new__(cls)
        self._setup(
            prompt_lookup_min=prompt_lookup_min,
            prompt_lookup_max=prompt_lookup_max,
            num_speculative_tokens=num_speculative_tokens,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
        )
        return self

    def _setup(
        self,
        prompt_lookup_min: int,
        prompt_lookup_max: int,
        num_speculative_tokens: int,
        max_model_len: int,
        max_num_seqs: int,
    ) -> None:
        if prompt_lookup_min < 1:
            raise ValueError(f"prompt_lookup_min must be >= 1, got {prompt_lookup_min}")
        if prompt_lookup_max < prompt_lookup_min:
            raise ValueError(
                f"prompt_lookup_min={prompt_lookup_min} must be <= "
                f"prompt_lookup_max={prompt_lookup_max}"
            )
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        if max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {max_model_len}")
        # Shortest / longest n-gram to match, tokens drafted after a match (fewer when
        # the context ends first), and the model's length bound.
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max
        self.k = num_speculative_tokens
        self.max_model_len = max_model_len
        # Per-row results of the last batch (upstream's buffers, same names):
        # row i holds request i's draft in [:valid_ngram_num_drafts[i]].
        rows = max(1, max_num_seqs)
        self.valid_ngram_draft = np.zeros((rows, self.k), dtype=np.int32)
        self.valid_ngram_num_drafts = np.zeros(rows, dtype=np.int32)

    def propose(
        self,
        num_speculative_tokens: int,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: object = None,  # unused, as upstream
    ) -> list[list[int]]:
        """One draft list per request (empty: no draft).

        ``token_ids_cpu[i, :num_tokens_no_spec[i]]`` is request i's context. A request
        with no sampled token this step (still in prefill) or already at
        ``max_model_len`` gets no draft.
        """
        if not 1 <= num_speculative_tokens <= self.k:
            raise ValueError(
                f"num_speculative_tokens={num_speculative_tokens} must be in [1, {self.k}]"
            )
        valid = [
            i
            for i, sampled in enumerate(sampled_token_ids)
            if sampled and int(num_tokens_no_spec[i]) < self.max_model_len
        ]
        return self.batch_propose(
            len(sampled_token_ids), valid, num_tokens_no_spec, token_ids_cpu, num_speculative_tokens
        )

    def batch_propose(
        self,
        num_requests: int,
        valid_ngram_requests: list[int],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        k: int,
    ) -> list[list[int]]:
        """Drafts for the rows in ``valid_ngram_requests``; ``[]`` for the others."""
        if num_requests > self.valid_ngram_draft.shape[0]:
            self.valid_ngram_draft = np.zeros((num_requests, self.k), dtype=np.int32)
            self.valid_ngram_num_drafts = np.zeros(num_requests, dtype=np.int32)
        self.valid_ngram_num_drafts[:num_requests] = 0
        if valid_ngram_requests:
            rows = np.asarray(valid_ngram_requests, dtype=np.int64)
            lengths = np.asarray(num_tokens_no_spec, dtype=np.int64)[rows]
            drafts, counts = find_ngram_drafts(
                token_ids_cpu, rows, lengths, self.min_n, self.max_n, self.max_model_len, k
            )
            self.valid_ngram_draft[rows, :k] = drafts
            self.valid_ngram_num_drafts[rows] = counts
        return [
            self.valid_ngram_draft[i, : self.valid_ngram_num_drafts[i]].tolist()
            for i in range(num_requests)
        ]

    def load_model(self, *args: object, **kwargs: object) -> None:
        """No model to load."""


def find_ngram_drafts(
    token_ids: np.ndarray,
    rows: np.ndarray,
    lengths: np.ndarray,
    min_n: int,
    max_n: int,
    max_model_len: int,
    k: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised prompt lookup for ``R = len(rows)`` requests.

    ``token_ids`` [B, W]: request ``rows[r]``'s context is ``token_ids[rows[r], :lengths[r]]``.
    Returns ``drafts`` [R, k] int32 (row r valid in ``[:counts[r]]``, zeros after) and
    ``counts`` [R] int32.
    """
    num = rows.shape[0]
    drafts = np.zeros((num, k), dtype=np.int32)
    counts = np.zeros(num, dtype=np.int32)
    # Draft budget per request: k, bounded by max_model_len; no lookup when the
    # context is shorter than min_n or the budget is zero.
    budget = np.minimum(k, max_model_len - lengths)
    todo = np.flatnonzero((lengths >= min_n) & (budget > 0))
    if todo.size == 0:
        return drafts, counts
    lens = lengths[todo]
    flat = np.concatenate([token_ids[rows[r], : lengths[r]] for r in todo])
    best_len, best_end = _longest_earliest_match(flat, lens, max_n)
    hit = np.flatnonzero(best_len >= min_n)
    if hit.size == 0:
        return drafts, counts
    # The match ends at local index best_end; the draft starts right after it and
    # stops at the context's end (best_end <= L - 2, so at least one token).
    starts = np.cumsum(lens) - lens
    first = best_end[hit] + 1
    n_draft = np.minimum(budget[todo[hit]], lens[hit] - first)
    offs = np.arange(k, dtype=np.int64)
    take = offs[None, :] < n_draft[:, None]
    gather = np.minimum(starts[hit, None] + first[:, None] + offs[None, :], flat.shape[0] - 1)
    drafts[todo[hit]] = np.where(take, flat[gather], 0).astype(np.int32)
    counts[todo[hit]] = n_draft.astype(np.int32)
    return drafts, counts


def _longest_earliest_match(
    flat: np.ndarray, lens: np.ndarray, max_n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per request: the longest (<= max_n) suffix match and the earliest end of it.

    ``flat`` [T]: the requests' contexts back to back, lengths ``lens`` [R] (all >= 1).
    For a position with local index ``e <= L - 2`` in its request, its match length
    is the largest m <= max_n with ``t[e-m+1 : e+1] == t[L-m : L]``.
    Returns (best m [R], smallest local e reaching it [R]); m = 0 where none.
    """
    num = lens.shape[0]
    starts = np.cumsum(lens) - lens
    ends = starts + lens
    best = np.zeros(num, dtype=np.int64)
    span = int(lens.max()) + 1
    # One full pass: candidate ends are the positions holding the request's last
    # token. Only those (few, unless the context repeats) are extended further back.
    cand = np.flatnonzero(flat == np.repeat(flat[ends - 1], lens))
    req = np.searchsorted(ends, cand, side="right")  # [C] request of each candidate
    local = cand - starts[req]
    keep = local <= lens[req] - 2  # a token must follow the occurrence
    cand, req, local = cand[keep], req[keep], local[keep]
    if cand.size == 0:
        return best, best.copy()
    match = np.ones(cand.size, dtype=np.int64)
    run = np.ones(cand.size, dtype=bool)
    for j in range(1, max_n):
        # Still matching after j tokens, and t[e-j] == t[L-1-j] (e - j >= 0).
        back = np.maximum(cand - j, 0)
        suffix_tok = flat[np.maximum(ends[req] - 1 - j, 0)]
        run &= (local >= j) & (flat[back] == suffix_tok)
        if not run.any():
            break
        match += run
    # One reduction per request: prefer the longer match, then the smaller e.
    score = match * span + (span - 1 - local)
    seg = np.flatnonzero(np.concatenate([[True], req[1:] != req[:-1]]))
    best[req[seg]] = np.maximum.reduceat(score, seg)
    return best // span, span - 1 - best % span
