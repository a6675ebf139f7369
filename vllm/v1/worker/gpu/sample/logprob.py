"""Top-k logprobs without a full-vocabulary softmax
(upstream: vllm/v1/worker/gpu/sample/logprob.py).

logprob(v) = logit(v) - logsumexp(logits), so only the k + 1 values asked for
are turned into logprobs; the [num_rows, vocab] logprob tensor is never built.
The sampled token's rank (1 = most likely) is the number of tokens whose logit
is at least its own, counted on the logits (the order is the same).
"""

from __future__ import annotations

import torch

from vllm.v1.outputs import LogprobsTensors


def compute_topk_logprobs(
    logits: torch.Tensor,
    num_logprobs: int,
    sampled_token_ids: torch.Tensor,
    as_logprobs: bool = True,
) -> LogprobsTensors:
    """For each row: the sampled token then the row's top `num_logprobs` tokens.

    logits: [n, vocab] float32; sampled_token_ids: [n] int64.
    Returns ids [n, 1 + k] int64, values [n, 1 + k] float32 (logprobs, or the
    logits themselves when `as_logprobs` is False), ranks [n] int64.
    """
    assert num_logprobs >= 0
    sampled = sampled_token_ids.to(torch.int64).unsqueeze(-1)
    token_ids = sampled
    if num_logprobs > 0:
        top = torch.topk(logits, num_logprobs, dim=-1).indices
        token_ids = torch.cat((sampled, top), dim=1)
    values = logits.gather(1, token_ids)
    if as_logprobs:
        values = values - torch.logsumexp(logits, dim=-1, keepdim=True)
    ranks = (logits >= logits.gather(1, sampled)).sum(-1)
    return LogprobsTensors(token_ids, values, ranks)
