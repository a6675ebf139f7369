"""Process groups over gloo in four processes: upstream's rank layout for
TP=2 x PP=2 and the collectives the layers and pipeline stages use."""

from __future__ import annotations

import torch

from tests.distributed.utils import init_gloo_rank, run_gloo_world


def _rank_main(rank: int, init_method: str, out) -> None:
    from vllm import distributed as d

    init_gloo_rank(4, rank, init_method, tp=2, pp=2)
    tp, pp = d.get_tp_group(), d.get_pp_group()
    x = torch.full((2, 3), float(rank + 1))
    reduced = d.tensor_model_parallel_all_reduce(x.clone())
    gathered = d.tensor_model_parallel_all_gather(x.clone(), dim=-1)
    to_first = d.tensor_model_parallel_gather(x.clone(), dst=0, dim=0)
    shared = tp.broadcast(torch.tensor([rank]), src=1)
    received = None
    if pp.is_first_rank:
        pp.send_tensor_dict(
            {
                "hidden_states": torch.arange(6.0).view(2, 3) + rank,
                "residual": torch.ones(2, 3, dtype=torch.bfloat16),
            }
        )
    else:
        got = pp.recv_tensor_dict()
        received = {k: (v.dtype, v.tolist()) for k, v in got.items()}
    out.put(
        (
            rank,
            dict(
                tp_ranks=tp.ranks,
                pp_ranks=pp.ranks,
                tp_rank=d.get_tensor_model_parallel_rank(),
                pp_first=pp.is_first_rank,
                pp_last=pp.is_last_rank,
                reduced=reduced[0, 0].item(),
                gathered=gathered[0].tolist(),
                gather=None if to_first is None else to_first[:, 0].tolist(),
                shared=shared.item(),
                received=received,
            ),
        )
    )
    d.destroy_distributed_environment()


def test_tp2_pp2_groups_and_collectives():
    results = run_gloo_world(_rank_main, 4)
    for rank, r in results.items():
        tp_peer = rank ^ 1  # ranks 2k and 2k+1 share a TP group
        assert r["tp_ranks"] == sorted([rank, tp_peer])
        assert r["pp_ranks"] == [rank % 2, rank % 2 + 2]
        assert r["tp_rank"] == rank % 2
        assert (r["pp_first"], r["pp_last"]) == (rank < 2, rank >= 2)
        lo = min(rank, tp_peer)
        assert r["reduced"] == (lo + 1) + (lo + 2)
        assert r["gathered"] == [lo + 1.0] * 3 + [lo + 2.0] * 3  # rank order
        assert r["gather"] == ([lo + 1.0] * 2 + [lo + 2.0] * 2 if rank == lo else None)
        assert r["shared"] == lo + 1  # TP rank 1's value
        if rank >= 2:  # the second stage got the first stage's tensors
            sender = rank - 2
            assert r["received"] == {
                "hidden_states": (torch.float32, (torch.arange(6.0).view(2, 3) + sender).tolist()),
                "residual": (torch.bfloat16, [[1.0] * 3] * 2),
            }
