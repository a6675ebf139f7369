"""Mamba-1 for causal LM (upstream: vllm/model_executor/models/mamba.py).

Attention-free: every block is RMSNorm -> MambaMixer with a residual. The
per-request state (conv + SSM) lives in a Mamba KV cache group with one slot
per request (`MambaSpec`), so the model declares `IsAttentionFree` and
`HasInnerState`; by the seed's rule it runs on the V1 model runner.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from vllm.config import VllmConfig
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.mamba.mamba_mixer import MambaMixer
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.models.interfaces import HasInnerState, IsAttentionFree
from vllm.model_executor.models.utils import (
    CausalLMBase,
    make_layers,
    maybe_prefix,
    norm_with_residual,
    single_stage_embeds,
)


class MambaDecoderLayer(nn.Module):
    def __init__(self, config: Any, prefix: str = "") -> None:
        super().__init__()
        self.mixer = MambaMixer(
            hidden_size=config.hidden_size,
            ssm_state_size=config.state_size,
            conv_kernel_size=config.conv_kernel,
            intermediate_size=config.intermediate_size,
            time_step_rank=int(config.time_step_rank),
            use_conv_bias=config.use_conv_bias,
            use_bias=config.use_bias,
            activation=config.hidden_act,
            prefix=f"{prefix}.mixer",
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)

    def forward(
        self, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden_states, residual = norm_with_residual(self.norm, hidden_states, residual)
        return self.mixer(hidden_states), residual


class MambaModel(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        assert vllm_config.model_config is not None
        config = vllm_config.model_config.hf_text_config
        self.embeddings = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.start_layer, self.end_layer, self.layers = make_layers(
            config.num_hidden_layers,
            lambda p: MambaDecoderLayer(config, prefix=p),
            prefix=f"{prefix}.layers",
        )
        self.norm_f = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embeddings(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden_states = single_stage_embeds(
            self, self.embeddings, input_ids, intermediate_tensors, inputs_embeds
        )
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(hidden_states, residual)
        hidden_states, _ = self.norm_f(hidden_states, residual)
        return hidden_states


class MambaForCausalLM(CausalLMBase, HasInnerState, IsAttentionFree):
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {}
    body_name: ClassVar[str] = "backbone"

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        assert vllm_config.model_config is not None
        config = vllm_config.model_config.hf_text_config
        self.config = config
        self.backbone = MambaModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "backbone"))
        self.init_lm_head(
            config,
            prefix,
            self.backbone.embeddings,
            tie=getattr(config, "tie_word_embeddings", True),
        )
