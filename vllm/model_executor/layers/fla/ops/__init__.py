"""Gated delta rule ops (upstream: vllm/model_executor/layers/fla/ops/)."""

from vllm.model_executor.layers.fla.ops.chunk import chunk_gated_delta_rule
from vllm.model_executor.layers.fla.ops.fused_recurrent import (
    fused_recurrent_gated_delta_rule,
    recurrent_gated_delta_rule_ref,
)

__all__ = [
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "recurrent_gated_delta_rule_ref",
]
