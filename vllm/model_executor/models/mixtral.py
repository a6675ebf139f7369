"""Mixtral (upstream: vllm/model_executor/models/mixtral.py).

Mistral's attention; every MLP is a sparse MoE block: a linear router over E
experts, softmax, the top k (2) experts per token with their weights
renormalised to sum to 1, each expert a SwiGLU MLP (w1 gate, w3 up, w2 down).
Mixtral is not on the Model Runner V2 whitelist, so it runs on V1.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import torch
from torch import nn
from transformers import PretrainedConfig

from vllm.config import VllmConfig
from vllm.model_executor.layers.fused_moe import FusedMoE
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from vllm.model_executor.models.moe_utils import load_moe_weights


class MixtralMoE(nn.Module):
    """x [T, H] -> sum over the top-k experts of weight * expert(x)."""

    def __init__(self, config: PretrainedConfig, prefix: str = "") -> None:
        super().__init__()
        self.gate = ReplicatedLinear(
            config.hidden_size, config.num_local_experts, bias=False, prefix=f"{prefix}.gate"
        )
        self.experts = FusedMoE(
            num_experts=config.num_local_experts,
            top_k=config.num_experts_per_tok,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            reduce_results=True,
            renormalize=True,
            prefix=f"{prefix}.experts",
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        router_logits, _ = self.gate(hidden_states)  # [T, E]
        return self.experts(hidden_states, router_logits)


class MixtralDecoderLayer(LlamaDecoderLayer):
    @classmethod
    def _make_mlp(
        cls, config: PretrainedConfig, prefix: str, quant_config: QuantizationConfig | None = None
    ) -> nn.Module:
        if quant_config is not None:
            raise NotImplementedError(f"Quantized MoE blocks are not built ({prefix}).")
        # The checkpoint calls the MoE block "block_sparse_moe"; here it is `mlp`.
        return MixtralMoE(config, prefix)


class MixtralForCausalLM(LlamaForCausalLM):
    # LoRA (inherited SupportsLoRA): the attention projections and the router
    # (`mlp.gate`, transformers 5's name; an older adapter's
    # `block_sparse_moe.gate` is refused as a module this model lacks). The
    # FusedMoE experts are no LoRA target: an adapter of them is refused on
    # load, naming the modules.
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
    }

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=MixtralDecoderLayer)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        experts = FusedMoE.make_expert_params_mapping(
            "w1", "w2", "w3", self.config.num_local_experts
        )
        weights = ((n.replace(".block_sparse_moe.", ".mlp."), w) for n, w in weights)
        skip = ["lm_head."] if getattr(self.config, "tie_word_embeddings", False) else []
        return load_moe_weights(self, weights, self.stacked_params_mapping[:3], experts, skip)
