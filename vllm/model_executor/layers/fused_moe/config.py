"""How one MoE layer is split over the ranks (upstream:
vllm/model_executor/layers/fused_moe/config.py, `FusedMoEParallelConfig`).

A MoE layer sees the tensor-parallel ranks of all data-parallel engines as
one flat group of dp x tp ranks (rank = dp_rank * tp + tp_rank): tokens of
every DP engine are gathered before the experts and the sums scattered back
after them (`vllm/distributed/device_communicators/all2all.py`). That flat
group then splits the experts one of two ways:

- without expert parallelism, every rank holds a 1/(dp x tp) slice of every
  expert's intermediate dimension (tp_size = dp x tp, ep_size = 1);
- with `enable_expert_parallel`, every rank holds whole experts, a
  1/(dp x tp) share of them (tp_size = 1, ep_size = dp x tp); which experts
  is the placement (`expert_map_manager.py`).
Either way every rank's output is a partial sum and the sum over the flat
group is the layer's output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.logger import init_logger

logger = init_logger(__name__)


@dataclass(frozen=True)
class FusedMoEParallelConfig:
    tp_size: int
    tp_rank: int
    dp_size: int
    dp_rank: int
    ep_size: int
    ep_rank: int
    use_ep: bool
    all2all_backend: str = "allgather_reducescatter"

    @property
    def use_all2all_kernels(self) -> bool:
        """Tokens cross DP engines (upstream: EP with dp > 1)."""
        return self.use_ep and self.dp_size > 1

    @staticmethod
    def flatten_tp_across_dp(
        tp_size: int, dp_size: int, dp_rank: int, tp_rank: int
    ) -> tuple[int, int]:
        """(size, rank) of the flat dp x tp group."""
        return tp_size * dp_size, dp_rank * tp_size + tp_rank

    @classmethod
    def make(
        cls, tp_size_: int, tp_rank_: int, dp_size_: int, dp_rank_: int, parallel_config: Any
    ) -> FusedMoEParallelConfig:
        """The split for a layer on TP rank `tp_rank_` of `tp_size_` in DP
        engine `dp_rank_` of `dp_size_`. `parallel_config` is the engine's
        `ParallelConfig` (None: no expert parallelism)."""
        enable_ep = bool(parallel_config is not None and parallel_config.enable_expert_parallel)
        # ParallelConfig refuses the backends not built here.
        backend = (
            parallel_config.all2all_backend
            if parallel_config is not None
            else "allgather_reducescatter"
        )
        size, rank = cls.flatten_tp_across_dp(tp_size_, dp_size_, dp_rank_, tp_rank_)
        use_ep = enable_ep and size > 1
        if not use_ep:
            return cls(size, rank, dp_size_, dp_rank_, 1, 0, False, backend)
        return cls(1, 0, dp_size_, dp_rank_, size, rank, True, backend)

    @classmethod
    def make_no_parallel(cls) -> FusedMoEParallelConfig:
        return cls(1, 0, 1, 0, 1, 0, False)
