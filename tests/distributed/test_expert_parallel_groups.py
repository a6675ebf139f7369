"""DP x TP = 2 x 2 in one gloo world of four processes (as the workers of two
MoE DP engines join it): upstream's DP / EP group layout, and one FusedMoE
layer whose two DP engines hold different token counts (3 and 5, padded by
the all-gather dispatch) gives every engine exactly its own rows of the
single-process layer, with experts split by tensor slices (tp_size 4) or by
expert parallelism (ep_size 4, linear placement: one of 4 experts each)."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.utils import init_gloo_rank, run_gloo_world

TOKENS = (3, 5)  # per DP engine
E, H, INTER, K = 4, 16, 8, 2


def _weights() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    w1, w3 = torch.randn(E, INTER, H, generator=g), torch.randn(E, INTER, H, generator=g)
    w2 = torch.randn(E, H, INTER, generator=g)
    x = torch.randn(sum(TOKENS), H, generator=g)
    return w1, w3, w2, x


def _reference() -> torch.Tensor:
    from vllm.model_executor.layers.fused_moe import fused_experts, fused_topk

    w1, w3, w2, x = _weights()
    logits = x[:, :E] * 3.0  # any deterministic router
    weights, ids = fused_topk(logits, K, renormalize=True)
    return fused_experts(x, torch.cat([w1, w3], dim=1), w2, weights, ids)


def _rank_main(rank: int, init_method: str, ep: bool, out) -> None:
    from vllm import distributed as d
    from vllm.config import ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed.parallel_state import get_dp_group, get_ep_group
    from vllm.model_executor.layers.fused_moe import FusedMoE

    init_gloo_rank(4, rank, init_method, tp=2)  # dp = 4 / (2 x 1)
    config = VllmConfig(
        parallel_config=ParallelConfig(tensor_parallel_size=2, enable_expert_parallel=ep)
    )
    with set_current_vllm_config(config):
        layer = FusedMoE(E, K, H, INTER, reduce_results=True)
    w1, w3, w2, x = _weights()
    for e in range(E):
        layer.weight_loader(layer.w13_weight, w1[e], "", "w1", e)
        layer.weight_loader(layer.w13_weight, w3[e], "", "w3", e)
        layer.weight_loader(layer.w2_weight, w2[e], "", "w2", e)
    dp_rank = get_dp_group().rank_in_group
    start = sum(TOKENS[:dp_rank])
    mine = x[start : start + TOKENS[dp_rank]]
    got = layer(mine, mine[:, :E] * 3.0)
    out.put(
        (
            rank,
            dict(
                dp_ranks=get_dp_group().ranks,
                ep_ranks=get_ep_group().ranks,
                tp_ranks=d.get_tp_group().ranks,
                split=(layer.tp_size, layer.tp_rank, layer.ep_size, layer.ep_rank),
                local_experts=layer.local_num_experts,
                out=got.tolist(),
            ),
        )
    )
    d.destroy_distributed_environment()


@pytest.mark.parametrize("ep", [False, True], ids=["tp-slices", "expert-parallel"])
def test_dp2_tp2_moe_layer_equals_single_process(ep):
    results = run_gloo_world(_rank_main, 4, ep)
    expected = _reference()
    for rank, r in results.items():
        dp_rank, tp_rank = divmod(rank, 2)
        assert r["tp_ranks"] == [2 * dp_rank, 2 * dp_rank + 1]
        assert r["dp_ranks"] == [tp_rank, tp_rank + 2]
        assert r["ep_ranks"] == [0, 1, 2, 3]
        assert r["split"] == ((1, 0, 4, rank) if ep else (4, rank, 1, 0))
        assert r["local_experts"] == (1 if ep else E)
        start = sum(TOKENS[:dp_rank])
        torch.testing.assert_close(
            torch.tensor(r["out"]), expected[start : start + TOKENS[dp_rank]]
        )
