"""Mixture-of-experts layers (upstream: vllm/model_executor/layers/fused_moe/)."""

from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts, fused_topk, grouped_topk
from vllm.model_executor.layers.fused_moe.layer import FusedMoE

__all__ = ["FusedMoE", "fused_experts", "fused_topk", "grouped_topk"]
