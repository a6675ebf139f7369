"""GraniteMoE (upstream: vllm/model_executor/models/granitemoe.py).

Mixtral's layout with IBM's scalars: embeddings x `embedding_multiplier`,
attention scores x `attention_multiplier` (instead of head_dim^-0.5), each
residual branch x `residual_multiplier`, logits / `logits_scaling`. The
router takes a softmax over the top-k logits (= softmax then renormalise),
and the checkpoint stores all experts stacked: input_linear [E, 2I, H]
(gate rows, then up rows) and output_linear [E, H, I].
On the Model Runner V2 whitelist.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import PretrainedConfig

from vllm.config import CacheConfig, VllmConfig
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.fused_moe import FusedMoE
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import QKVParallelLinear, ReplicatedLinear, RowParallelLinear
from vllm.model_executor.layers.rotary_embedding import get_rope, get_rope_parameters
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader, get_weight_loader
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.utils import (
    CausalLMBase,
    load_stacked_weights,
    make_layers,
    maybe_prefix,
    single_stage_embeds,
)


class GraniteMoeMoE(nn.Module):
    def __init__(self, config: PretrainedConfig, prefix: str = "") -> None:
        super().__init__()
        self.router = ReplicatedLinear(
            config.hidden_size, config.num_local_experts, bias=False, prefix=f"{prefix}.router"
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
        router_logits, _ = self.router(hidden_states)
        return self.experts(hidden_states, router_logits)


class GraniteMoeAttention(nn.Module):
    def __init__(
        self, config: PretrainedConfig, cache_config: CacheConfig | None, prefix: str
    ) -> None:
        super().__init__()
        self.head_dim = config.hidden_size // config.num_attention_heads
        bias = getattr(config, "attention_bias", False)
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            self.head_dim,
            config.num_attention_heads,
            config.num_key_value_heads,
            bias=bias,
            prefix=f"{prefix}.qkv_proj",
        )
        self.q_size = self.qkv_proj.num_heads * self.head_dim
        self.kv_size = self.qkv_proj.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * self.head_dim,
            config.hidden_size,
            bias=bias,
            prefix=f"{prefix}.o_proj",
        )
        base, rope_scaling = get_rope_parameters(config)
        self.rotary_emb = get_rope(
            self.head_dim,
            rotary_dim=self.head_dim,
            max_position=config.max_position_embeddings,
            base=base,
            is_neox_style=True,
            rope_scaling=rope_scaling,
        )
        self.attn = Attention(
            self.qkv_proj.num_heads,
            self.head_dim,
            config.attention_multiplier,
            num_kv_heads=self.qkv_proj.num_kv_heads,
            cache_config=cache_config,
            prefix=f"{prefix}.attn",
        )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        output, _ = self.o_proj(self.attn(q, k, v))
        return output


class GraniteMoeDecoderLayer(nn.Module):
    """x + m * attn(norm(x)), then + m * moe(norm(.)), m = residual_multiplier."""

    def __init__(
        self, config: PretrainedConfig, cache_config: CacheConfig | None, prefix: str
    ) -> None:
        super().__init__()
        self.self_attn = GraniteMoeAttention(config, cache_config, f"{prefix}.self_attn")
        self.block_sparse_moe = GraniteMoeMoE(config, f"{prefix}.block_sparse_moe")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.residual_multiplier = config.residual_multiplier

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        h = self.self_attn(positions, self.input_layernorm(hidden_states))
        hidden_states = hidden_states + h * self.residual_multiplier
        h = self.block_sparse_moe(self.post_attention_layernorm(hidden_states))
        return hidden_states + h * self.residual_multiplier


class GraniteMoeModel(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        assert vllm_config.model_config is not None
        config = vllm_config.model_config.hf_text_config
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.embedding_multiplier = config.embedding_multiplier
        self.start_layer, self.end_layer, self.layers = make_layers(
            config.num_hidden_layers,
            lambda p: GraniteMoeDecoderLayer(config, vllm_config.cache_config, p),
            prefix=f"{prefix}.layers",
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden_states = single_stage_embeds(
            self, self.embed_tokens, input_ids, intermediate_tensors, inputs_embeds
        )
        hidden_states = hidden_states * self.embedding_multiplier
        for layer in self.layers:
            hidden_states = layer(positions, hidden_states)
        return self.norm(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The stacked expert tensors go to FusedMoE whole (all experts at
        once); input_linear splits into its gate (w1) and up (w3) halves."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        dense = []
        for name, weight in weights:
            if ".block_sparse_moe.input_linear." in name:
                target = name.replace("input_linear.weight", "experts.w13_weight")
                gate, up = weight.chunk(2, dim=1)
                experts_loader = get_weight_loader(params[target])
                experts_loader(params[target], gate, name, shard_id="w1")
                experts_loader(params[target], up, name, shard_id="w3")
            elif ".block_sparse_moe.output_linear." in name:
                target = name.replace("output_linear.weight", "experts.w2_weight")
                get_weight_loader(params[target])(params[target], weight, name, shard_id="w2")
            elif ".block_sparse_moe.router.layer." in name:
                target = name.replace("router.layer.", "router.")
                default_weight_loader(params[target], weight)
            else:
                dense.append((name, weight))
                continue
            loaded.add(target)
        return loaded | load_stacked_weights(
            self, dense, LlamaForCausalLM.stacked_params_mapping[:3]
        )


class GraniteMoeForCausalLM(CausalLMBase):
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
    }

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        assert vllm_config.model_config is not None
        config = vllm_config.model_config.hf_text_config
        self.config = config
        self.model = GraniteMoeModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.init_lm_head(
            config,
            prefix,
            self.model.embed_tokens,
            tie=getattr(config, "tie_word_embeddings", False),
            scale=1.0 / config.logits_scaling,
        )
