"""Expert placement maps (linear / round_robin, uneven counts), the
round-robin fallback, the FusedMoE split under EP (local experts only, only
their checkpoint tensors loaded) and that the per-rank partial sums of
`fused_experts` add up to the whole layer."""

from __future__ import annotations

import pytest
import torch

from vllm.config import ParallelConfig, VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.fused_moe import FusedMoE, fused_experts
from vllm.model_executor.layers.fused_moe.config import FusedMoEParallelConfig
from vllm.model_executor.layers.fused_moe.expert_map_manager import (
    compute_local_expert_ids,
    determine_expert_map,
    determine_expert_placement_strategy,
    non_local_expert_filter,
    parse_expert_id,
)


def test_linear_placement_is_contiguous_blocks_with_remainder_first():
    assert [compute_local_expert_ids(8, 2, r) for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # 10 experts over 4 ranks: 3, 3, 2, 2.
    assert [compute_local_expert_ids(10, 4, r) for r in range(4)] == [
        [0, 1, 2],
        [3, 4, 5],
        [6, 7],
        [8, 9],
    ]
    count, expert_map = determine_expert_map(2, 1, 8, "linear")
    assert count == 4
    assert expert_map is not None
    assert expert_map.tolist() == [-1, -1, -1, -1, 0, 1, 2, 3]
    assert determine_expert_map(1, 0, 8) == (8, None)
    assert compute_local_expert_ids(8, 1, 0) is None


def test_round_robin_placement_interleaves():
    assert [compute_local_expert_ids(8, 2, r, "round_robin") for r in range(2)] == [
        [0, 2, 4, 6],
        [1, 3, 5, 7],
    ]
    assert compute_local_expert_ids(10, 4, 1, "round_robin") == [1, 5, 9]
    _, expert_map = determine_expert_map(4, 1, 10, "round_robin")
    assert expert_map is not None
    assert expert_map.tolist() == [-1, 0, -1, -1, -1, 1, -1, -1, -1, 2]
    with pytest.raises(ValueError, match="placement strategy 'striped'"):
        determine_expert_map(2, 0, 8, "striped")


def test_every_expert_is_placed_exactly_once():
    for strategy in ("linear", "round_robin"):
        for num_experts, ep in ((8, 2), (10, 4), (5, 3), (64, 6)):
            held = [compute_local_expert_ids(num_experts, ep, r, strategy) for r in range(ep)]
            flat = sorted(e for ids in held for e in (ids or []))
            assert flat == list(range(num_experts)), (strategy, num_experts, ep)


def test_round_robin_falls_back_to_linear_as_upstream():
    single = FusedMoEParallelConfig(1, 0, 1, 0, 2, 0, True)
    across_dp = FusedMoEParallelConfig(1, 0, 2, 0, 4, 0, True)
    assert determine_expert_placement_strategy("round_robin", single, 4) == "round_robin"
    assert determine_expert_placement_strategy("round_robin", single, None) == "linear"
    assert determine_expert_placement_strategy("round_robin", across_dp, 4) == "linear"
    assert determine_expert_placement_strategy("linear", single, 4) == "linear"


def test_parallel_config_split():
    ep = ParallelConfig(tensor_parallel_size=2, enable_expert_parallel=True)
    # TP=2, DP=2, rank (dp 1, tp 0): flat rank 2 of 4.
    assert FusedMoEParallelConfig.make(2, 0, 2, 1, ep) == FusedMoEParallelConfig(
        1, 0, 2, 1, 4, 2, True
    )
    tp_only = ParallelConfig(tensor_parallel_size=2)
    assert FusedMoEParallelConfig.make(2, 1, 2, 1, tp_only) == FusedMoEParallelConfig(
        4, 3, 2, 1, 1, 0, False
    )
    # EP with a single rank is no EP.
    assert not FusedMoEParallelConfig.make(1, 0, 1, 0, ep).use_ep


def test_ep_layer_holds_and_loads_only_local_experts():
    torch.manual_seed(0)
    num_experts, hidden, inter = 4, 8, 6
    w1 = torch.randn(num_experts, inter, hidden)
    w3 = torch.randn(num_experts, inter, hidden)
    w2 = torch.randn(num_experts, hidden, inter)
    config = VllmConfig(
        parallel_config=ParallelConfig(
            enable_expert_parallel=True, expert_placement_strategy="round_robin"
        )
    )
    with set_current_vllm_config(config):
        # tp_size=2 in a one-process group: this is EP rank 0 of 2.
        layer = FusedMoE(num_experts, 2, hidden, inter, tp_size=2, num_expert_group=2, topk_group=1)
    assert (layer.local_num_experts, layer.ep_size, layer.ep_rank) == (2, 2, 0)
    assert layer.expert_placement_strategy == "round_robin"
    assert layer.w13_weight.shape == (2, 2 * inter, hidden)  # whole experts, half of them
    layer.w13_weight.data.fill_(float("nan"))
    for e in range(num_experts):
        for shard, w in (("w1", w1[e]), ("w3", w3[e])):
            layer.weight_loader(layer.w13_weight, w, f"experts.{e}.{shard}.weight", shard, e)
        layer.weight_loader(layer.w2_weight, w2[e], f"experts.{e}.w2.weight", "w2", e)
    for slot, e in enumerate((0, 2)):
        torch.testing.assert_close(layer.w13_weight[slot], torch.cat([w1[e], w3[e]]))
        torch.testing.assert_close(layer.w2_weight[slot], w2[e])
    assert parse_expert_id("model.layers.3.mlp.experts.12.gate_proj.weight") == 12
    assert parse_expert_id("model.layers.3.mlp.shared_experts.gate_proj.weight") is None
    # The loader does not even read the other rank's expert tensors (1 and 3).
    skip = non_local_expert_filter(torch.nn.Sequential(layer))
    assert skip is not None
    names = [f"model.layers.0.mlp.experts.{e}.w1.weight" for e in range(num_experts)]
    assert [skip(n) for n in names] == [False, True, False, True]
    assert not skip("model.layers.0.mlp.shared_experts.gate_proj.weight")
    assert not skip("model.layers.0.mlp.experts.w13_weight")
    assert non_local_expert_filter(torch.nn.Linear(2, 2)) is None


def test_partial_sums_over_ep_ranks_equal_the_whole_layer():
    torch.manual_seed(0)
    x, w13, w2 = torch.randn(9, 16), torch.randn(6, 24, 16), torch.randn(6, 16, 12)
    ids = torch.stack([torch.randperm(6)[:2] for _ in range(9)])
    weights = torch.rand(9, 2)
    whole = fused_experts(x, w13, w2, weights, ids)
    for strategy in ("linear", "round_robin"):
        total = torch.zeros_like(whole)
        for rank in range(4):
            local = compute_local_expert_ids(6, 4, rank, strategy)
            assert local is not None
            _, expert_map = determine_expert_map(4, rank, 6, strategy)
            total += fused_experts(x, w13[local], w2[local], weights, ids, expert_map=expert_map)
        torch.testing.assert_close(total, whole)
