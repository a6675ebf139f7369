"""FusedMoE against a per-token reference: routing (plain and DeepSeek's
group-limited top-k), the expert computation, and loading by expert id."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.fused_moe import FusedMoE, fused_experts, grouped_topk


def _reference_moe(x, w13, w2, weights, ids):
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for w, e in zip(weights[t].tolist(), ids[t].tolist()):
            gate, up = (w13[e] @ x[t]).chunk(2)
            out[t] += w * (w2[e] @ (F.silu(gate) * up))
    return out


def test_fused_experts_matches_per_token_loop():
    torch.manual_seed(0)
    x, w13, w2 = torch.randn(7, 16), torch.randn(5, 24, 16), torch.randn(5, 16, 12)
    ids = torch.randint(0, 5, (7, 2))
    ids[:, 1] = (ids[:, 0] + 1) % 5  # distinct experts per token
    weights = torch.rand(7, 2)
    torch.testing.assert_close(
        fused_experts(x, w13, w2, weights, ids), _reference_moe(x, w13, w2, weights, ids)
    )


def test_grouped_topk_picks_only_from_the_best_groups():
    # 8 experts in 4 groups of 2; only the 2 best groups (by best expert) are eligible.
    logits = torch.tensor([[0.0, 5.0, 4.9, 4.8, 1.0, 1.1, 4.7, 0.0]])
    weights, ids = grouped_topk(logits, topk=3, renormalize=False, num_expert_group=4, topk_group=2)
    # Groups: {0,1} best 5.0, {2,3} best 4.9, {4,5} 1.1, {6,7} 4.7 -> groups 0 and 1.
    assert sorted(ids[0].tolist()) == [1, 2, 3]
    probs = torch.softmax(logits, dim=-1)
    torch.testing.assert_close(weights[0].sort().values, probs[0, [1, 2, 3]].sort().values)
    # Expert 6 is among the 4 best overall but its group is not eligible.
    _, plain = torch.topk(probs, 4)
    assert 6 in plain[0].tolist() and 6 not in ids[0].tolist()


@pytest.mark.parametrize("renormalize", [True, False])
def test_layer_loads_by_expert_id_and_routes(renormalize):
    torch.manual_seed(1)
    with set_current_vllm_config(VllmConfig()):
        moe = FusedMoE(
            num_experts=3, top_k=2, hidden_size=8, intermediate_size=6, renormalize=renormalize
        )
    gate = [torch.randn(6, 8) for _ in range(3)]
    up = [torch.randn(6, 8) for _ in range(3)]
    down = [torch.randn(8, 6) for _ in range(3)]
    mapping = FusedMoE.make_expert_params_mapping("gate_proj", "down_proj", "up_proj", 3)
    ckpt = {
        f"mlp.experts.{e}.{n}.weight": w
        for e in range(3)
        for n, w in (("gate_proj", gate[e]), ("down_proj", down[e]), ("up_proj", up[e]))
    }
    params = {"mlp.experts.w13_weight": moe.w13_weight, "mlp.experts.w2_weight": moe.w2_weight}
    for name, w in ckpt.items():
        param_part, weight_part, expert_id, shard_id = next(m for m in mapping if m[1] in name)
        param = params[name.replace(weight_part, param_part)]
        param.weight_loader(param, w, name, shard_id=shard_id, expert_id=expert_id)
    for e in range(3):
        torch.testing.assert_close(moe.w13_weight[e], torch.cat([gate[e], up[e]]))
        torch.testing.assert_close(moe.w2_weight[e], down[e])
    x, logits = torch.randn(4, 8), torch.randn(4, 3)
    probs = torch.softmax(logits, dim=-1)
    weights, ids = torch.topk(probs, 2)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    w13 = torch.stack([torch.cat([g, u]) for g, u in zip(gate, up)])
    torch.testing.assert_close(
        moe(x, logits), _reference_moe(x, w13, torch.stack(down), weights, ids)
    )
