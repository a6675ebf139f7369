"""Top-k / top-p filtering and random sampling
(upstream: vllm/v1/sample/ops/topk_topp_sampler.py).

Every op is vectorised over the batch: per-row parameters are tensors, and no
op loops over requests or over the vocabulary. The only per-request loop is in
`random_sample`, over the seeded rows, because each of them must draw its
uniform from its own `torch.Generator`.
"""

from __future__ import annotations

import torch
import torch.nn as nn


class TopKTopPSampler(nn.Module):
    """Filters logits with per-row top-k and top-p, then samples one token per row.

    `forward` returns `(sampled_token_ids [num_reqs] int64, processed)`, where
    `processed` holds the filtered logits (or their logprobs) when the
    logprobs mode asks for them, else None.
    """

    def __init__(self, logprobs_mode: str = "raw_logprobs") -> None:
        super().__init__()
        self.logprobs_mode = logprobs_mode

    def forward(
        self,
        logits: torch.Tensor,
        generators: dict[int, torch.Generator],
        k: torch.Tensor | None,
        p: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = apply_top_k_top_p(logits, k, p)
        processed: torch.Tensor | None = None
        if self.logprobs_mode == "processed_logits":
            processed = logits.clone()
        elif self.logprobs_mode == "processed_logprobs":
            processed = logits.log_softmax(dim=-1)
        probs = logits.softmax(dim=-1, dtype=torch.float32)
        return random_sample(probs, generators), processed


def apply_top_k_top_p(
    logits: torch.Tensor,
    k: torch.Tensor | None,
    p: torch.Tensor | None,
) -> torch.Tensor:
    """Set to -inf every logit outside its row's top-k and top-p sets.

    logits: [num_reqs, vocab] float32, modified in place.
    k: [num_reqs]; a row with k == vocab is not filtered. Ties with the k-th
       value are kept (so a row can keep more than k tokens), as transformers'
       TopKLogitsWarper does.
    p: [num_reqs]; the smallest set of most likely tokens whose probability
       mass reaches p is kept, and always at least the most likely token.
    """
    if k is None and p is None:
        return logits
    if logits.device.type != "cpu":
        # On an accelerator a full sort of each row is cheap and reads nothing
        # back; the shortcuts below decide on the host (`bool(...)`,
        # `int(k.max())`), a sync per step (tests/v1/worker/gpu/test_no_host_sync_gpu.py).
        return _top_k_top_p_by_sort(logits, k, p)
    if p is None:
        assert k is not None
        return apply_top_k_only(logits, k)
    if _top_k_top_p_from_candidates(logits, k, p):
        return logits
    return _top_k_top_p_by_sort(logits, k, p)


# Top-p is first tried among each row's most likely tokens: `topk` of 256 out
# of a 32k-150k vocabulary costs a small fraction of a full sort, and for the
# usual p (and peaked distributions) the kept set lies well inside them.
TOP_P_CANDIDATES = 256


def _top_k_top_p_from_candidates(
    logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor
) -> bool:
    """`apply_top_k_top_p` computed among each row's TOP_P_CANDIDATES most
    likely tokens, in place. Returns False (logits untouched) unless that is
    exact for every row: the row's top-k already drops every other token, or
    the candidates hold at least mass p, so the next token (whose mass above
    is then >= p) is dropped, and so is everything after it.

    Keep rule, in descending order: a token stays while the mass of the
    tokens strictly more likely than it is < p (the sort path's rule, read
    from the other end), and the most likely token always stays.
    """
    vocab = logits.shape[1]
    c = min(vocab, TOP_P_CANDIDATES)
    cand, cand_idx = logits.topk(c, dim=-1)  # [B, c], descending
    lse = torch.logsumexp(logits, dim=-1)  # softmax over the whole row
    no_top_p = p >= 1.0
    if k is None:
        with_top_k = torch.zeros_like(no_top_p)
    else:
        k = k.to(torch.long)
        with_top_k = k < vocab
        if bool((with_top_k & (k > c)).any()):
            return False  # a k-th value outside the candidates
        kth = cand.gather(1, (k.clamp(1, c) - 1).unsqueeze(1))
        # Ties with the k-th value are kept; they must not reach past c.
        if c < vocab and bool((with_top_k & (cand[:, -1] >= kth[:, 0])).any()):
            return False
        cand = cand.masked_fill(with_top_k.unsqueeze(1) & (cand < kth), float("-inf"))
        # Top-k rows renormalise over their k survivors (all among the candidates).
        lse = torch.where(with_top_k, torch.logsumexp(cand, dim=-1), lse)
    probs = (cand - lse.unsqueeze(1)).exp()
    cum = probs.cumsum(dim=-1)
    if c < vocab and not bool((with_top_k | no_top_p | (cum[:, -1] >= p)).all()):
        return False
    keep = (cum - probs) < p.unsqueeze(1)
    keep[:, 0] = True
    # p >= 1 rows keep every candidate their top-k left (and, without top-k,
    # the whole row: it is left untouched below).
    keep |= no_top_p.unsqueeze(1)
    kept = cand.masked_fill(~keep, float("-inf"))
    untouched = no_top_p & ~with_top_k
    if bool(untouched.all()):
        return True
    filtered = torch.full_like(logits, float("-inf")).scatter_(1, cand_idx, kept)
    logits.copy_(torch.where(untouched.unsqueeze(1), logits, filtered))
    return True


def _top_k_top_p_by_sort(
    logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None
) -> torch.Tensor:
    """`apply_top_k_top_p` over a full sort of each row (any k and p), with
    no host sync."""
    # Work in ascending order: the k-th largest value sits at index vocab - k,
    # and the tokens to drop for top-p form a prefix of the sorted row.
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if k is not None:
        kth_index = (logits_sort.size(1) - k.to(torch.long)).unsqueeze(1)
        kth_value = logits_sort.gather(1, kth_index)
        logits_sort.masked_fill_(logits_sort < kth_value, float("-inf"))
    if p is None:
        return logits.scatter_(dim=-1, index=logits_idx, src=logits_sort)

    probs_sort = logits_sort.softmax(dim=-1)
    cum_probs = torch.cumsum(probs_sort, dim=-1, out=probs_sort)
    # Drop a token when the mass of all tokens up to and including it (in
    # ascending order) is at most 1 - p: the rest still hold at least p.
    drop = cum_probs <= (1 - p.unsqueeze(1))
    drop[:, -1] = False  # the most likely token always survives
    logits_sort.masked_fill_(drop, float("-inf"))
    return logits.scatter_(dim=-1, index=logits_idx, src=logits_sort)


def apply_top_k_only(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Top-k without a full sort: one `topk` of the largest k in the batch.

    logits: [num_reqs, vocab], modified in place; k: [num_reqs].
    """
    vocab_size = logits.shape[1]
    no_top_k = k >= vocab_size
    # Rows without top-k take k=1 for the gather below, then get a -inf
    # threshold so nothing is dropped.
    k = k.to(torch.long).masked_fill(no_top_k, 1)
    max_k = int(k.max())
    top_values = logits.topk(max_k, dim=-1).values  # [num_reqs, max_k], descending
    threshold = top_values.gather(1, (k - 1).unsqueeze(1))
    threshold.masked_fill_(no_top_k.unsqueeze(1), float("-inf"))
    return logits.masked_fill_(logits < threshold, float("-inf"))


# Tokens per block in the two-level search of `inverse_cdf_sample`: small
# enough that the per-row gather and cumsum inside the chosen block are cheap,
# large enough that the block-level cumsum is short (125 blocks for 32000).
_CDF_BLOCK = 256


def random_sample(
    probs: torch.Tensor,
    generators: dict[int, torch.Generator],
) -> torch.Tensor:
    """Sample one token per row from `probs` [num_reqs, vocab] (rows need not
    be normalised; zero entries are never drawn). Returns [num_reqs] int64.

    Inverse-CDF sampling with one uniform per row. The exponential race
    (argmax(p_i / E_i)) that upstream uses needs one random number per
    vocabulary entry, ~15 ns each on CPU (~30 ms for 64 x 32000); this needs
    one read of `probs`. Seeded rows draw their uniform from their own
    generator (exactly one draw per step), so their tokens depend neither on
    their batch-mates nor on their row; the other rows share the default
    generator. `probs` is not modified.
    """
    num_reqs = probs.shape[0]
    # float64: 53 random bits, so a token's chance is its probability to
    # ~1e-16 rather than to float32's 2^-24 resolution.
    u = torch.empty(num_reqs, 1, dtype=torch.float64, device=probs.device)
    if len(generators) != num_reqs:
        u.uniform_()
    for row, generator in generators.items():
        u[row].uniform_(generator=generator)
    return inverse_cdf_sample(probs, u)


def inverse_cdf_sample(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token whose cdf interval holds u * (row total), for each row.

    probs: [num_reqs, vocab] (any float dtype, >= 0); u: [num_reqs, 1]
    float64 in [0, 1). Returns [num_reqs] int64.

    Two levels, all in float64 and without a [num_reqs, vocab] temporary:
    the vocabulary is cut into blocks of _CDF_BLOCK tokens (the last one may
    be shorter); a search in the cdf of the block sums picks the block, and a
    search in the cdf of that block's probabilities picks the token, at the
    position the uniform's residual inside the block (itself uniform) points to.
    """
    num_reqs, vocab = probs.shape
    sums = _block_sums(probs)  # [num_reqs, num_blocks]
    block_cdf = sums.cumsum(dim=-1)
    target = u * block_cdf[:, -1:]
    block = _search(block_cdf, target)
    below = block_cdf.gather(1, (block - 1).clamp(min=0)).masked_fill_(block == 0, 0.0)
    # The residual is in [0, 1) in exact arithmetic; rounding may push it an
    # ulp outside, and r < 1 keeps the inner target below the block's total.
    residual = ((target - below) / sums.gather(1, block)).clamp_(0.0, 1.0 - 2.0**-53)

    positions = block * _CDF_BLOCK + torch.arange(_CDF_BLOCK, device=probs.device)
    in_vocab = positions < vocab  # False only past the end of a short last block
    inner = probs.gather(1, positions.clamp(max=vocab - 1)).to(torch.float64)
    inner_cdf = inner.masked_fill_(~in_vocab, 0.0).cumsum(dim=-1)
    offset = _search(inner_cdf, residual * inner_cdf[:, -1:])
    token = (block * _CDF_BLOCK + offset).clamp_(max=vocab - 1)
    if not probs.is_cpu:
        # A parallel scan (CUDA) may associate the sums differently for
        # neighbouring entries, so its cdf can dip by an ulp and the argument
        # in `_search` no longer holds: never return a zero-probability token.
        token = replace_zero_prob_tokens(probs, token)
    return token.view(-1)


def _block_sums(probs: torch.Tensor) -> torch.Tensor:
    """[num_reqs, vocab] -> [num_reqs, ceil(vocab / _CDF_BLOCK)] float64 sums."""
    num_reqs, vocab = probs.shape
    num_full = vocab // _CDF_BLOCK
    full = probs[:, : num_full * _CDF_BLOCK].reshape(num_reqs, num_full, _CDF_BLOCK)
    sums = full.sum(dim=-1, dtype=torch.float64)
    if num_full * _CDF_BLOCK < vocab:
        tail = probs[:, num_full * _CDF_BLOCK :].sum(dim=-1, keepdim=True, dtype=torch.float64)
        sums = torch.cat((sums, tail), dim=1)
    return sums


def _search(cdf: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """First index i with cdf[i] > target, per row. cdf: [n, m] non-decreasing;
    target: [n, 1] in [0, cdf[:, -1]). Returns [n, 1] int64 in [0, m).

    right=True is what keeps zero-probability entries out: such an entry has
    cdf[i] == cdf[i-1] (the CPU cumsum adds sequentially), so the search stops
    at an earlier entry first; and target >= 0 skips leading zeros (cdf == 0).
    The clamp only guards against a target that is not below the total.
    """
    return torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.shape[1] - 1)


def replace_zero_prob_tokens(probs: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """Where probs[row, token[row]] == 0, take the row's most likely token
    instead. token: [num_reqs, 1] int64. Branch-free (no device sync)."""
    chosen = probs.gather(1, token)
    return torch.where(chosen > 0, token, probs.argmax(dim=-1, keepdim=True))
