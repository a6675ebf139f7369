"""Mixture-of-experts math in plain PyTorch (upstream:
vllm/model_executor/layers/fused_moe/fused_moe.py, whose Triton kernels this
replaces on CPU).

Shapes: T tokens, H hidden, E experts, I expert intermediate size (of this
tensor-parallel rank), K experts per token.
- routing: router_logits [T, E] -> topk_weights [T, K] float32, topk_ids [T, K] int64
- experts: w13 [E, 2I, H] (gate rows then up rows), w2 [E, H, I]
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def fused_topk(
    router_logits: torch.Tensor, topk: int, renormalize: bool, scoring_func: str = "softmax"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Score every expert (softmax or sigmoid, in float32), keep the top k;
    with `renormalize` the kept weights are rescaled to sum to 1."""
    scores = _score(router_logits, scoring_func)
    topk_weights, topk_ids = torch.topk(scores, topk, dim=-1)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids


def grouped_topk(
    router_logits: torch.Tensor,
    topk: int,
    renormalize: bool,
    num_expert_group: int,
    topk_group: int,
    scoring_func: str = "softmax",
    e_score_correction_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's group-limited routing: experts form `num_expert_group`
    equal groups; a group scores as its best expert (or, with a correction
    bias, its two best biased scores), only the `topk_group` best groups stay
    eligible, and the top k experts are chosen among them. Weights are the
    unbiased scores of the chosen experts."""
    scores = _score(router_logits, scoring_func)  # [T, E]
    num_tokens, num_experts = scores.shape
    if num_experts % num_expert_group:
        raise ValueError(f"{num_experts} experts do not split into {num_expert_group} groups.")
    choice = scores if e_score_correction_bias is None else scores + e_score_correction_bias
    grouped = choice.view(num_tokens, num_expert_group, -1)  # [T, G, E / G]
    if e_score_correction_bias is None:
        group_scores = grouped.max(dim=-1).values
    else:
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
    group_idx = torch.topk(group_scores, topk_group, dim=-1, sorted=False).indices  # [T, g]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1.0).bool()
    expert_mask = group_mask.unsqueeze(-1).expand_as(grouped).reshape(num_tokens, -1)
    masked = choice.masked_fill(~expert_mask, float("-inf"))
    topk_ids = torch.topk(masked, topk, dim=-1, sorted=False).indices
    topk_weights = scores.gather(1, topk_ids)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids


def _score(router_logits: torch.Tensor, scoring_func: str) -> torch.Tensor:
    if scoring_func == "softmax":
        return torch.softmax(router_logits.float(), dim=-1)
    if scoring_func == "sigmoid":
        return router_logits.float().sigmoid()
    raise ValueError(f"Unsupported MoE scoring function {scoring_func!r}.")


_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"silu": F.silu, "gelu": F.gelu}


def fused_experts(
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
    expert_map: torch.Tensor | None = None,
) -> torch.Tensor:
    """sum_k weight[t, k] * expert_{id[t, k]}(x[t]) for every token t -> [T, H].

    The T*K (token, expert) pairs are sorted by expert so each expert runs one
    GEMM over all its tokens; the weighted outputs are scattered back with one
    index_add. Only experts that received tokens run. With `expert_map`
    (expert parallelism: global id -> local slot of w13/w2, -1 elsewhere)
    only the pairs routed to this rank's experts count: the result is this
    rank's partial sum.
    """
    if activation not in _ACTIVATIONS:
        raise ValueError(f"Unsupported MoE activation {activation!r}.")
    act = _ACTIVATIONS[activation]
    top_k = topk_ids.shape[1]
    flat_ids = topk_ids.reshape(-1)
    flat_weights = topk_weights.reshape(-1)
    pair_token = torch.arange(flat_ids.numel(), device=flat_ids.device) // top_k
    if expert_map is not None:
        flat_ids = expert_map[flat_ids].long()
        local = flat_ids >= 0
        flat_ids, flat_weights, pair_token = flat_ids[local], flat_weights[local], pair_token[local]
    order = torch.argsort(flat_ids, stable=True)  # pair indices grouped by expert
    token_of_pair = pair_token.index_select(0, order)
    counts = torch.bincount(flat_ids, minlength=w13.shape[0]).tolist()
    inputs = hidden_states.index_select(0, token_of_pair)  # [P, H], expert-sorted
    outputs = torch.empty(
        inputs.shape[0], w2.shape[1], dtype=hidden_states.dtype, device=hidden_states.device
    )
    start = 0
    for expert_id, count in enumerate(counts):
        if count == 0:
            continue
        end = start + count
        gate_up = F.linear(inputs[start:end], w13[expert_id])  # [n, 2I]
        gate, up = gate_up.chunk(2, dim=-1)
        outputs[start:end] = F.linear(act(gate) * up, w2[expert_id])
        start = end
    weights = flat_weights.index_select(0, order).unsqueeze(1)
    result = torch.zeros_like(hidden_states)
    result.index_add_(0, token_of_pair, (outputs.float() * weights).to(hidden_states.dtype))
    return result
