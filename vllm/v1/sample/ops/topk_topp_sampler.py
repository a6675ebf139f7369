"""Top-k / top-p filtering and random sampling
(upstream: vllm/v1/sample/ops/topk_topp_sampler.py).

Every op is vectorised over the batch: per-row parameters are tensors, and no
op loops over requests or over the vocabulary. The only per-request loop is in
`random_sample`, over the seeded rows, because each of them must draw from its
own `torch.Generator`.
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
    if p is None:
        if k is None:
            return logits
        return apply_top_k_only(logits, k)

    # Work in ascending order: the k-th largest value sits at index vocab - k,
    # and the tokens to drop for top-p form a prefix of the sorted row.
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if k is not None:
        kth_index = (logits_sort.size(1) - k.to(torch.long)).unsqueeze(1)
        kth_value = logits_sort.gather(1, kth_index)
        logits_sort.masked_fill_(logits_sort < kth_value, float("-inf"))

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


def random_sample(
    probs: torch.Tensor,
    generators: dict[int, torch.Generator],
) -> torch.Tensor:
    """Sample one token per row from `probs` [num_reqs, vocab].

    Exponential race: argmax(p_i / E_i) with E_i ~ Exponential(1) picks token i
    with probability p_i (it is the Gumbel-max trick in another form) and needs
    neither a cumulative sum nor a CPU-GPU sync, unlike torch.multinomial.
    Seeded rows draw their noise from their own generator, so their tokens do
    not depend on which other requests share the batch or on the row they sit in.
    `probs` is overwritten.
    """
    q = torch.empty_like(probs)
    if len(generators) != probs.shape[0]:
        q.exponential_()
    for row, generator in generators.items():
        q[row].exponential_(generator=generator)
    return probs.div_(q).argmax(dim=-1).view(-1)
