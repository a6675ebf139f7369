"""The mixture-of-experts layer (upstream: vllm/model_executor/layers/fused_moe/layer.py).

All experts' weights are stacked into two parameters:
    w13_weight [E, 2 * I_tp, H]   rows [0, I_tp) = gate (w1), [I_tp, 2 I_tp) = up (w3)
    w2_weight  [E, H, I_tp]       down projection
where I_tp = intermediate_size / tp_size: under tensor parallelism every rank
holds a slice of every expert's intermediate dimension, and the partial
outputs are summed across ranks (`reduce_results`). With expert parallelism
E is this rank's share of the experts (whole experts, I_tp = I) and
`expert_map` maps global expert ids to its slots; with data parallelism the
tokens of all DP engines go through every rank's experts (see
`vllm/model_executor/layers/fused_moe/config.py` for the split,
`expert_map_manager.py` for the placement). Checkpoints store one tensor per
expert and projection; `make_expert_params_mapping` names them and
`weight_loader` copies each into its expert's slot (experts held by other
ranks are skipped).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parameter import Parameter

from vllm.config import get_current_vllm_config_or_none
from vllm.distributed import (
    divide,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    get_tp_group,
    tensor_model_parallel_all_reduce,
)
from vllm.distributed.device_communicators.all2all import AgRsAll2AllManager
from vllm.distributed.parallel_state import get_dp_group
from vllm.model_executor.layers.fused_moe.config import FusedMoEParallelConfig
from vllm.model_executor.layers.fused_moe.expert_map_manager import (
    determine_expert_map,
    determine_expert_placement_strategy,
)
from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts, fused_topk, grouped_topk
from vllm.model_executor.utils import set_weight_attrs


class FusedMoE(nn.Module):
    """Routed experts: router logits -> top-k experts per token -> their
    weighted sum.

    Args:
        num_experts: Experts in the layer (E).
        top_k: Experts per token (K).
        hidden_size: H.
        intermediate_size: Full (unsharded) intermediate size of one expert.
        reduce_results: All-reduce the output across tensor-parallel ranks
            (False when the caller reduces once after adding shared experts).
        renormalize: Rescale the top-k weights to sum to 1.
        use_grouped_topk: DeepSeek group-limited routing (`num_expert_group`
            groups, `topk_group` of them eligible per token).
        scoring_func: "softmax" or "sigmoid".
        routed_scaling_factor: Multiplies the routing weights.
        e_score_correction_bias: Per-expert bias used only to choose experts.
        activation: Gate activation ("silu").
    """

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        params_dtype: torch.dtype | None = None,
        reduce_results: bool = False,
        renormalize: bool = True,
        use_grouped_topk: bool = False,
        num_expert_group: int | None = None,
        topk_group: int | None = None,
        quant_config: Any = None,
        tp_size: int | None = None,
        prefix: str = "",
        scoring_func: str = "softmax",
        routed_scaling_factor: float = 1.0,
        e_score_correction_bias: torch.Tensor | None = None,
        activation: str = "silu",
    ) -> None:
        super().__init__()
        if quant_config is not None:
            raise NotImplementedError("Quantized MoE is not built.")
        if use_grouped_topk and (num_expert_group is None or topk_group is None):
            raise ValueError("Grouped top-k needs num_expert_group and topk_group.")
        self._init_parallel(num_experts, tp_size, num_expert_group)
        self.top_k = top_k
        self.hidden_size = hidden_size
        self.intermediate_size_per_partition = divide(intermediate_size, self.tp_size)
        self.reduce_results = reduce_results
        self.renormalize = renormalize
        self.use_grouped_topk = use_grouped_topk
        self.num_expert_group = num_expert_group
        self.topk_group = topk_group
        self.scoring_func = scoring_func
        self.routed_scaling_factor = routed_scaling_factor
        self.e_score_correction_bias = e_score_correction_bias
        self.activation = activation
        self.layer_name = prefix
        dtype = params_dtype or torch.get_default_dtype()
        i_tp, local = self.intermediate_size_per_partition, self.local_num_experts
        self.w13_weight = Parameter(
            torch.empty(local, 2 * i_tp, hidden_size, dtype=dtype), requires_grad=False
        )
        self.w2_weight = Parameter(
            torch.empty(local, hidden_size, i_tp, dtype=dtype), requires_grad=False
        )
        for param in (self.w13_weight, self.w2_weight):
            set_weight_attrs(param, {"weight_loader": self.weight_loader})

    def _init_parallel(
        self, num_experts: int, tp_size: int | None, num_expert_group: int | None
    ) -> None:
        """The split of this layer over the dp x tp ranks: tp_size / tp_rank
        slice each expert, ep_size / ep_rank and expert_map pick the experts."""
        vllm_config = get_current_vllm_config_or_none()
        parallel_config = vllm_config.parallel_config if vllm_config is not None else None
        tp = tp_size or get_tensor_model_parallel_world_size()
        tp_rank = get_tensor_model_parallel_rank() if tp > 1 else 0
        dp_group = get_dp_group()
        self.moe_parallel_config = FusedMoEParallelConfig.make(
            tp, tp_rank, dp_group.world_size, dp_group.rank_in_group, parallel_config
        )
        cfg = self.moe_parallel_config
        self.tp_size, self.tp_rank = cfg.tp_size, cfg.tp_rank
        self.dp_size, self.ep_size, self.ep_rank = cfg.dp_size, cfg.ep_size, cfg.ep_rank
        self.use_ep = cfg.use_ep
        self.global_num_experts = num_experts
        self.expert_placement_strategy = "linear"
        if cfg.use_ep and parallel_config is not None:
            self.expert_placement_strategy = determine_expert_placement_strategy(
                parallel_config.expert_placement_strategy, cfg, num_expert_group
            )
        self.local_num_experts, expert_map = determine_expert_map(
            cfg.ep_size, cfg.ep_rank, num_experts, self.expert_placement_strategy
        )
        # A buffer so that it follows the layer to its device; not in the state dict.
        self.expert_map: torch.Tensor | None
        self.register_buffer("expert_map", expert_map, persistent=False)
        self.all2all_manager = AgRsAll2AllManager(dp_group) if cfg.dp_size > 1 else None

    def _map_global_to_local_expert(self, expert_id: int) -> int:
        """The local slot of a global expert id; -1 when another rank holds it."""
        if self.expert_map is None:
            return expert_id
        return int(self.expert_map[expert_id])

    @staticmethod
    def make_expert_params_mapping(
        ckpt_gate_proj_name: str, ckpt_down_proj_name: str, ckpt_up_proj_name: str, num_experts: int
    ) -> list[tuple[str, str, int, str]]:
        """(param prefix, checkpoint name part, expert id, shard id) per expert
        and projection, e.g. ("experts.w13_", "experts.3.gate_proj.", 3, "w1"):
        replace the second by the first in a checkpoint name to get the param."""
        return [
            (
                "experts.w13_"
                if name in (ckpt_gate_proj_name, ckpt_up_proj_name)
                else "experts.w2_",
                f"experts.{expert_id}.{name}.",
                expert_id,
                shard_id,
            )
            for expert_id in range(num_experts)
            for shard_id, name in (
                ("w1", ckpt_gate_proj_name),
                ("w2", ckpt_down_proj_name),
                ("w3", ckpt_up_proj_name),
            )
        ]

    def weight_loader(
        self,
        param: Parameter,
        loaded_weight: torch.Tensor,
        weight_name: str = "",
        shard_id: str = "",
        expert_id: int | None = None,
    ) -> None:
        """Copy one expert's projection (this rank's slice) into the stack.

        w1/w3: checkpoint [I, H] -> rows of w13 (gate first, then up);
        w2: checkpoint [H, I] -> w2. With expert_id None the tensor holds all
        experts at once ([E, ...], as GraniteMoe stores them)."""
        if shard_id not in ("w1", "w2", "w3"):
            raise ValueError(f"Unknown expert shard id {shard_id!r}.")
        if expert_id is None:
            for e in range(loaded_weight.shape[0]):
                self.weight_loader(param, loaded_weight[e], weight_name, shard_id, e)
            return
        local_id = self._map_global_to_local_expert(expert_id)
        if local_id < 0:  # held by another expert-parallel rank
            return
        i_tp = self.intermediate_size_per_partition
        expert = param.data[local_id]
        if shard_id == "w2":  # split the input (intermediate) dim
            src = loaded_weight.narrow(1, self.tp_rank * i_tp, i_tp)
            dst = expert
        else:  # split the output (intermediate) dim
            src = loaded_weight.narrow(0, self.tp_rank * i_tp, i_tp)
            dst = expert.narrow(0, 0 if shard_id == "w1" else i_tp, i_tp)
        if dst.shape != src.shape:
            raise ValueError(
                f"Expert weight shape {tuple(src.shape)} does not fit "
                f"{tuple(dst.shape)} ({weight_name}, {shard_id})."
            )
        dst.copy_(src)

    def select_experts(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """router_logits [T, E] -> (topk_weights [T, K] float32, topk_ids [T, K])."""
        if self.use_grouped_topk:
            # Both set when grouped (checked in __init__).
            assert self.num_expert_group is not None and self.topk_group is not None
            weights, ids = grouped_topk(
                router_logits,
                self.top_k,
                self.renormalize,
                self.num_expert_group,
                self.topk_group,
                self.scoring_func,
                self.e_score_correction_bias,
            )
        else:
            weights, ids = fused_topk(
                router_logits, self.top_k, self.renormalize, self.scoring_func
            )
        if self.routed_scaling_factor != 1.0:
            weights = weights * self.routed_scaling_factor
        return weights, ids

    def forward(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """hidden_states [T, H], router_logits [T, E] -> [T, H].

        With dp > 1 the tokens of all DP engines are dispatched to this rank
        first and the summed outputs combined back; the TP all-reduce then
        adds the partial sums of this engine's TP ranks."""
        meta = None
        if self.all2all_manager is not None:
            hidden_states, router_logits, meta = self.all2all_manager.dispatch(
                hidden_states, router_logits
            )
        topk_weights, topk_ids = self.select_experts(router_logits)
        out = fused_experts(
            hidden_states,
            self.w13_weight,
            self.w2_weight,
            topk_weights,
            topk_ids,
            self.activation,
            expert_map=self.expert_map,
        )
        if self.all2all_manager is not None:
            assert meta is not None
            out = self.all2all_manager.combine(out, meta)
        if self.reduce_results and get_tp_group().world_size > 1:
            out = tensor_model_parallel_all_reduce(out)
        return out

    def extra_repr(self) -> str:
        return (
            f"global_num_experts={self.global_num_experts}, "
            f"local_num_experts={self.local_num_experts}, ep_size={self.ep_size}, "
            f"placement={self.expert_placement_strategy}, top_k={self.top_k}, "
            f"intermediate_size_per_partition={self.intermediate_size_per_partition}, "
            f"tp_size={self.tp_size}, renormalize={self.renormalize}, "
            f"use_grouped_topk={self.use_grouped_topk}, scoring_func={self.scoring_func}"
        )
