"""OPT for causal LM (upstream: vllm/model_executor/models/opt.py).

Differs from Llama in every block: learned absolute positions (looked up at
position + 2, an offset kept from fairseq), LayerNorm with bias, a plain
fc1 -> ReLU -> fc2 MLP, biased projections, and an optional projection
between a narrower word embedding and the hidden size. The LM head is tied to
the word embeddings.

Tensor shapes: T = number of tokens in the step (all requests flattened).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import PretrainedConfig

from vllm.config import CacheConfig, VllmConfig
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.models.utils import (
    CausalLMBase,
    load_stacked_weights,
    make_layers,
    maybe_prefix,
)

_ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}


class OPTLearnedPositionalEmbedding(nn.Embedding):
    """Position p reads row p + 2 (OPT reserves the first two rows)."""

    offset = 2

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__(num_embeddings + self.offset, embedding_dim)
        self.weight.requires_grad_(False)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(positions + self.offset)


class OPTAttention(nn.Module):
    """Biased q/k/v (fused here) -> paged attention -> biased out_proj; no rotary."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        bias: bool = True,
        cache_config: CacheConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim**-0.5
        self.qkv_proj = QKVParallelLinear(
            embed_dim, self.head_dim, num_heads, bias=bias, prefix=f"{prefix}.qkv_proj"
        )
        self.num_heads = self.qkv_proj.num_heads
        self.q_size = self.num_heads * self.head_dim
        self.out_proj = RowParallelLinear(
            embed_dim, embed_dim, bias=bias, prefix=f"{prefix}.out_proj"
        )
        self.attn = Attention(
            self.num_heads,
            self.head_dim,
            self.scaling,
            cache_config=cache_config,
            prefix=f"{prefix}.attn",
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)  # [T, 3 * q_size]
        q, k, v = qkv.chunk(3, dim=-1)
        output, _ = self.out_proj(self.attn(q, k, v))
        return output


class OPTDecoderLayer(nn.Module):
    """Pre-LN (`do_layer_norm_before`, most checkpoints) or post-LN (OPT-350m) block."""

    def __init__(
        self, config: PretrainedConfig, cache_config: CacheConfig | None = None, prefix: str = ""
    ) -> None:
        super().__init__()
        self.embed_dim = config.hidden_size
        bias = getattr(config, "enable_bias", True)
        self.self_attn = OPTAttention(
            self.embed_dim,
            config.num_attention_heads,
            bias=bias,
            cache_config=cache_config,
            prefix=f"{prefix}.self_attn",
        )
        self.do_layer_norm_before = config.do_layer_norm_before
        affine = getattr(config, "layer_norm_elementwise_affine", True)
        self.self_attn_layer_norm = nn.LayerNorm(self.embed_dim, elementwise_affine=affine)
        self.fc1 = ColumnParallelLinear(
            self.embed_dim, config.ffn_dim, bias=bias, prefix=f"{prefix}.fc1"
        )
        if config.activation_function not in _ACTIVATIONS:
            raise ValueError(f"OPT activation {config.activation_function!r} is not supported.")
        self.activation_fn = _ACTIVATIONS[config.activation_function]()
        self.fc2 = RowParallelLinear(
            config.ffn_dim, self.embed_dim, bias=bias, prefix=f"{prefix}.fc2"
        )
        self.final_layer_norm = nn.LayerNorm(self.embed_dim, elementwise_affine=affine)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        residual = hidden_states
        if self.do_layer_norm_before:
            hidden_states = self.self_attn_layer_norm(hidden_states)
        hidden_states = residual + self.self_attn(hidden_states)
        if not self.do_layer_norm_before:
            hidden_states = self.self_attn_layer_norm(hidden_states)

        residual = hidden_states
        if self.do_layer_norm_before:
            hidden_states = self.final_layer_norm(hidden_states)
        hidden_states, _ = self.fc1(hidden_states)
        hidden_states, _ = self.fc2(self.activation_fn(hidden_states))
        hidden_states = residual + hidden_states
        if not self.do_layer_norm_before:
            hidden_states = self.final_layer_norm(hidden_states)
        return hidden_states


class OPTDecoder(nn.Module):
    def __init__(
        self, config: PretrainedConfig, cache_config: CacheConfig | None = None, prefix: str = ""
    ) -> None:
        super().__init__()
        self.config = config
        proj_dim = config.word_embed_proj_dim
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, proj_dim)
        self.embed_positions = OPTLearnedPositionalEmbedding(
            config.max_position_embeddings, config.hidden_size
        )
        # A narrower word embedding (OPT-350m) is projected in and out.
        self.project_in = self.project_out = None
        if proj_dim != config.hidden_size:
            self.project_in = ReplicatedLinear(
                proj_dim, config.hidden_size, bias=False, prefix=f"{prefix}.project_in"
            )
            self.project_out = ReplicatedLinear(
                config.hidden_size, proj_dim, bias=False, prefix=f"{prefix}.project_out"
            )
        self.final_layer_norm = None
        if config.do_layer_norm_before and not getattr(config, "_remove_final_layer_norm", False):
            affine = getattr(config, "layer_norm_elementwise_affine", True)
            self.final_layer_norm = nn.LayerNorm(config.hidden_size, elementwise_affine=affine)
        self.start_layer, self.end_layer, self.layers = make_layers(
            config.num_hidden_layers,
            lambda p: OPTDecoderLayer(config, cache_config, prefix=p),
            prefix=f"{prefix}.layers",
        )

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if self.project_in is not None:
            inputs_embeds, _ = self.project_in(inputs_embeds)
        hidden_states = inputs_embeds + self.embed_positions(positions)
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        if self.final_layer_norm is not None:
            hidden_states = self.final_layer_norm(hidden_states)
        if self.project_out is not None:
            hidden_states, _ = self.project_out(hidden_states)
        return hidden_states


class OPTModel(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        assert vllm_config.model_config is not None
        config = vllm_config.model_config.hf_text_config
        self.decoder = OPTDecoder(
            config, vllm_config.cache_config, prefix=maybe_prefix(prefix, "decoder")
        )

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.decoder.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if intermediate_tensors is not None:
            raise NotImplementedError("Pipeline parallelism is not built.")
        return self.decoder(input_ids, positions, inputs_embeds)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_stacked_weights(self, weights, OPTForCausalLM.stacked_params_mapping)


class OPTForCausalLM(CausalLMBase):
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
    }
    stacked_params_mapping: ClassVar[list[tuple[str, str, str | int]]] = [
        (".qkv_proj", ".q_proj", "q"),
        (".qkv_proj", ".k_proj", "k"),
        (".qkv_proj", ".v_proj", "v"),
    ]

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        assert vllm_config.model_config is not None
        config = vllm_config.model_config.hf_text_config
        self.config = config
        self.model = OPTModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.init_lm_head(
            config,
            prefix,
            self.model.decoder.embed_tokens,
            tie=getattr(config, "tie_word_embeddings", True),
            hidden_size=config.word_embed_proj_dim,
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        # Some OPT checkpoints name the body "decoder." without the "model." prefix.
        return super().load_weights(
            (name if name.startswith(("model.", "lm_head.")) else f"model.{name}", w)
            for name, w in weights
        )
