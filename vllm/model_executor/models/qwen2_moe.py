"""Qwen2-MoE (upstream: vllm/model_executor/models/qwen2_moe.py).

Qwen2's attention (q/k/v bias); MoE layers every `decoder_sparse_step`
layers (except `mlp_only_layers`), each with routed experts (softmax top-k,
renormalised only when `norm_topk_prob`) plus a shared expert, a dense
SwiGLU MLP always applied and scaled by sigmoid(shared_expert_gate(x)).
On the Model Runner V2 whitelist.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from vllm.config import VllmConfig
from vllm.model_executor.layers.fused_moe import FusedMoE
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.models.llama import LlamaForCausalLM, LlamaMLP
from vllm.model_executor.models.moe_utils import load_moe_weights
from vllm.model_executor.models.qwen2 import Qwen2DecoderLayer
from vllm.model_executor.models.utils import extract_layer_index


class Qwen2MoeSparseMoeBlock(nn.Module):
    def __init__(self, config: PretrainedConfig, prefix: str = "") -> None:
        super().__init__()
        self.gate = ReplicatedLinear(
            config.hidden_size, config.num_experts, bias=False, prefix=f"{prefix}.gate"
        )
        self.experts = FusedMoE(
            num_experts=config.num_experts,
            top_k=config.num_experts_per_tok,
            hidden_size=config.hidden_size,
            intermediate_size=config.moe_intermediate_size,
            reduce_results=True,
            renormalize=config.norm_topk_prob,
            prefix=f"{prefix}.experts",
        )
        self.shared_expert = None
        if config.shared_expert_intermediate_size > 0:
            self.shared_expert = LlamaMLP(
                config.hidden_size,
                config.shared_expert_intermediate_size,
                config.hidden_act,
                prefix=f"{prefix}.shared_expert",
            )
        self.shared_expert_gate = ReplicatedLinear(
            config.hidden_size, 1, bias=False, prefix=f"{prefix}.shared_expert_gate"
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[T, H] -> routed experts + sigmoid(gate) * shared expert, [T, H]."""
        router_logits, _ = self.gate(hidden_states)
        out = self.experts(hidden_states, router_logits)
        if self.shared_expert is not None:
            shared_gate, _ = self.shared_expert_gate(hidden_states)  # [T, 1]
            out = out + F.sigmoid(shared_gate) * self.shared_expert(hidden_states)
        return out


class Qwen2MoeDecoderLayer(Qwen2DecoderLayer):
    @classmethod
    def _make_mlp(
        cls, config: PretrainedConfig, prefix: str, quant_config: QuantizationConfig | None = None
    ) -> nn.Module:
        if quant_config is not None:
            raise NotImplementedError(f"Quantized MoE blocks are not built ({prefix}).")
        layer_idx = extract_layer_index(prefix)
        is_sparse = (
            layer_idx not in config.mlp_only_layers
            and config.num_experts > 0
            and (layer_idx + 1) % config.decoder_sparse_step == 0
        )
        if is_sparse:
            return Qwen2MoeSparseMoeBlock(config, prefix)
        return LlamaMLP(
            config.hidden_size, config.intermediate_size, config.hidden_act, prefix=prefix
        )


class Qwen2MoeForCausalLM(LlamaForCausalLM):
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = dict(
        LlamaForCausalLM.packed_modules_mapping
    )

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=Qwen2MoeDecoderLayer)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        experts = FusedMoE.make_expert_params_mapping(
            "gate_proj", "down_proj", "up_proj", self.config.num_experts
        )
        skip = ["lm_head."] if getattr(self.config, "tie_word_embeddings", False) else []
        return load_moe_weights(self, weights, self.stacked_params_mapping, experts, skip)
