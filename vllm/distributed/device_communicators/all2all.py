"""Token dispatch and combine of MoE layers across data-parallel engines
(upstream: vllm/distributed/device_communicators/all2all.py, the
"allgather_reducescatter" backend, the default `--all2all-backend`).

With dp > 1 every DP engine runs each forward pass together (idle engines run
a dummy batch), and a MoE layer's experts are split over all dp x tp ranks
(`vllm/model_executor/layers/fused_moe/config.py`). So before the experts,
every rank all-gathers the hidden states and router logits of all DP engines
over its DP group; after them, the partial outputs are summed over the DP
group and each engine keeps its own rows (a reduce-scatter).

Deviation: gloo's all_gather takes equal sizes and has no reduce_scatter, so
each engine's rows are padded to the step's largest token count and the
combine is an all-reduce followed by taking this engine's block. The token
counts of all engines are all-gathered once per forward pass (the first MoE
layer does it) and kept in the forward context as upstream's `DPMetadata`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm.distributed.parallel_state import GroupCoordinator, get_dp_group
from vllm.forward_context import get_forward_context, is_forward_context_available

_DP_METADATA_KEY = "dp_metadata"


@dataclass(frozen=True)
class DPMetadata:
    """Token counts of one forward pass on every DP engine."""

    num_tokens_across_dp: tuple[int, ...]

    @property
    def max_tokens_across_dp(self) -> int:
        return max(self.num_tokens_across_dp)

    @classmethod
    def gather(cls, num_tokens: int, dp_group: GroupCoordinator) -> DPMetadata:
        counts = torch.tensor([num_tokens], dtype=torch.int64)
        if dp_group.world_size > 1:
            parts = [torch.empty_like(counts) for _ in range(dp_group.world_size)]
            torch.distributed.all_gather(parts, counts, group=dp_group.cpu_group)
            counts = torch.cat(parts)
        return cls(tuple(int(c) for c in counts.tolist()))


def get_dp_metadata(num_tokens: int, dp_group: GroupCoordinator) -> DPMetadata:
    """This forward's DPMetadata: computed by the first MoE layer of the pass
    and reused by the others (every engine's layers call this in the same
    order, so the collective lines up)."""
    if not is_forward_context_available():
        return DPMetadata.gather(num_tokens, dp_group)
    extra = get_forward_context().extra
    meta = extra.get(_DP_METADATA_KEY)
    if meta is None:
        meta = extra[_DP_METADATA_KEY] = DPMetadata.gather(num_tokens, dp_group)
    return meta


class AgRsAll2AllManager:
    """All-gather dispatch, all-reduce + slice combine over the DP group."""

    def __init__(self, dp_group: GroupCoordinator | None = None) -> None:
        self.dp_group = dp_group or get_dp_group()

    def dispatch(
        self, hidden_states: torch.Tensor, router_logits: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, DPMetadata]:
        """[T, H], [T, E] of this engine -> [dp * max_T, H], [dp * max_T, E]
        of all engines (rows past an engine's count are padding: zero states,
        whose expert outputs are discarded by `combine`)."""
        meta = get_dp_metadata(hidden_states.shape[0], self.dp_group)
        pad = meta.max_tokens_across_dp - hidden_states.shape[0]
        both = torch.cat([hidden_states, router_logits.to(hidden_states.dtype)], dim=-1)
        if pad:
            both = torch.nn.functional.pad(both, (0, 0, 0, pad))
        gathered = self.dp_group.all_gather(both, dim=0)
        hidden = gathered[:, : hidden_states.shape[1]]
        logits = gathered[:, hidden_states.shape[1] :].to(router_logits.dtype)
        return hidden, logits, meta

    def combine(self, hidden_states: torch.Tensor, meta: DPMetadata) -> torch.Tensor:
        """Sum the partial outputs over the DP group; this engine's rows."""
        summed = self.dp_group.all_reduce(hidden_states.contiguous())
        rank = self.dp_group.rank_in_group
        start = rank * meta.max_tokens_across_dp
        return summed[start : start + meta.num_tokens_across_dp[rank]]
