"""Expert placement under expert parallelism (upstream:
vllm/model_executor/layers/fused_moe/expert_map_manager.py and
vllm/model_executor/model_loader/ep_weight_filter.py).

E experts over an EP group of n ranks: every rank gets E // n experts and the
first E % n ranks one more. `--expert-placement-strategy` picks which:

- "linear" (default): contiguous blocks. E=8, n=2: rank 0 holds 0-3, rank 1
  holds 4-7.
- "round_robin": expert e on rank e % n. E=8, n=2: rank 0 holds 0,2,4,6,
  rank 1 holds 1,3,5,7. As upstream it only applies to models with expert
  groups (DeepSeek's grouped top-k, where it spreads each group over the
  ranks) and without cross-engine token dispatch (dp = 1); otherwise the
  layer falls back to linear with a warning.

A rank's `expert_map` maps a global expert id to its local slot, -1 for
experts held elsewhere; routed pairs to -1 are skipped by this rank (another
rank computes them) and its checkpoint tensors are not loaded here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal, get_args

import torch

from vllm.logger import init_logger
from vllm.model_executor.layers.fused_moe.config import FusedMoEParallelConfig

logger = init_logger(__name__)

# Same values as ParallelConfig.expert_placement_strategy.
ExpertPlacementStrategy = Literal["linear", "round_robin"]

_EXPERT_ID_RE = re.compile(r"\.experts\.(\d+)\.")


def compute_local_expert_ids(
    num_experts: int, ep_size: int, ep_rank: int, placement: str = "linear"
) -> list[int] | None:
    """The global ids of the experts EP rank `ep_rank` holds, in local slot
    order; None when EP is off (every expert is local)."""
    if ep_size <= 1:
        return None
    base, remainder = divmod(num_experts, ep_size)
    count = base + (1 if ep_rank < remainder else 0)
    if placement == "linear":
        start = ep_rank * base + min(ep_rank, remainder)
        return list(range(start, start + count))
    if placement == "round_robin":
        return list(range(ep_rank, num_experts, ep_size))
    raise ValueError(
        f"Unsupported expert placement strategy {placement!r}, expected one of "
        f"{get_args(ExpertPlacementStrategy)}."
    )


def determine_expert_map(
    ep_size: int,
    ep_rank: int,
    global_num_experts: int,
    expert_placement_strategy: str = "linear",
) -> tuple[int, torch.Tensor | None]:
    """(local expert count, expert_map [E] int32: global id -> local slot or
    -1); the map is None when ep_size is 1."""
    local_ids = compute_local_expert_ids(
        global_num_experts, ep_size, ep_rank, expert_placement_strategy
    )
    if local_ids is None:
        return global_num_experts, None
    expert_map = torch.full((global_num_experts,), -1, dtype=torch.int32)
    expert_map[torch.tensor(local_ids, dtype=torch.long)] = torch.arange(
        len(local_ids), dtype=torch.int32
    )
    return len(local_ids), expert_map


def determine_expert_placement_strategy(
    strategy: str, moe_parallel_config: FusedMoEParallelConfig, num_expert_group: int | None
) -> str:
    """The strategy a layer really uses: round_robin only for grouped
    experts without cross-engine dispatch (as upstream), else linear."""
    if strategy != "round_robin":
        return strategy
    if num_expert_group is None or num_expert_group <= 1:
        logger.warning(
            "Round-robin expert placement is only supported for models with multiple "
            "expert groups. Falling back to linear expert placement."
        )
        return "linear"
    if moe_parallel_config.use_all2all_kernels:
        logger.warning(
            "Round-robin expert placement is not supported with the '%s' all2all "
            "backend across data-parallel engines. Falling back to linear expert placement.",
            moe_parallel_config.all2all_backend,
        )
        return "linear"
    return strategy


def parse_expert_id(weight_name: str) -> int | None:
    """The expert id in a per-expert checkpoint name (".experts.42.w1.weight"),
    None for any other tensor (dense, shared experts, stacked experts)."""
    m = _EXPERT_ID_RE.search(weight_name)
    return int(m.group(1)) if m else None


def non_local_expert_filter(model: torch.nn.Module) -> Callable[[str], bool] | None:
    """A checkpoint-name predicate that is true for the per-expert weights of
    experts this rank does not hold (upstream: ep_weight_filter.py), so the
    loader skips them without reading them; None without expert parallelism.
    Every MoE layer of a model places its experts alike."""
    from vllm.model_executor.layers.fused_moe.layer import FusedMoE

    for module in model.modules():
        if isinstance(module, FusedMoE) and module.expert_map is not None:
            local = set((module.expert_map >= 0).nonzero().flatten().tolist())
            return lambda name: _is_other_ranks_expert(name, local)
    return None


def _is_other_ranks_expert(weight_name: str, local_expert_ids: set[int]) -> bool:
    expert_id = parse_expert_id(weight_name)
    # Shared experts and stacked (all-expert) tensors carry no id: kept.
    return (
        expert_id is not None
        and weight_name.endswith(".weight")
        and expert_id not in local_expert_ids
    )
