"""Llama (and Mistral) for causal LM (upstream: vllm/model_executor/models/llama.py).

The decoder structure here is shared: Qwen2 and Qwen3 reuse it with their own
attention biases / q-k norms (see qwen2.py, qwen3.py).

Tensor shapes: T = number of tokens in the step (all requests flattened).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import torch
from torch import nn
from transformers import PretrainedConfig

from vllm.config import CacheConfig, VllmConfig
from vllm.distributed import get_pp_group
from vllm.model_executor.layers.activation import get_act_and_mul_fn
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.layers.rotary_embedding import get_rope, get_rope_parameters
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.models.adapters import as_seq_cls_model
from vllm.model_executor.models.interfaces import (
    EagleModelMixin,
    SupportsEagle,
    SupportsEagle3,
    SupportsLoRA,
    SupportsPP,
)
from vllm.model_executor.models.utils import (
    CausalLMBase,
    PPMissingLayer,
    extract_layer_index,
    load_stacked_weights,
    make_empty_intermediate_tensors_factory,
    make_layers,
    maybe_prefix,
    norm_with_residual,
)
from vllm.sequence import IntermediateTensors


def get_layer_sliding_window(config: PretrainedConfig, layer_idx: int) -> int | None:
    """The sliding window of one layer: per `layer_types` when the config has it
    (Qwen2/3, newer Mistral), else the global `sliding_window` (older Mistral)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return window if layer_types[layer_idx] == "sliding_attention" else None
    if getattr(config, "use_sliding_window", True) is False:
        return None
    return window


class LlamaMLP(nn.Module):
    """x [T, hidden] -> down(act(gate(x)) * up(x)) [T, hidden]."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        hidden_act: str,
        quant_config: QuantizationConfig | None = None,
        bias: bool = False,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size,
            [intermediate_size] * 2,
            bias=bias,
            quant_config=quant_config,
            prefix=f"{prefix}.gate_up_proj",
        )
        self.down_proj = RowParallelLinear(
            intermediate_size,
            hidden_size,
            bias=bias,
            quant_config=quant_config,
            prefix=f"{prefix}.down_proj",
        )
        self.act_fn = get_act_and_mul_fn(hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, _ = self.gate_up_proj(x)  # [T, 2 * intermediate]
        x, _ = self.down_proj(self.act_fn(gate_up))
        return x


class LlamaAttention(nn.Module):
    """Fused qkv projection -> rotary -> paged attention -> o_proj."""

    def __init__(
        self,
        config: PretrainedConfig,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        max_position_embeddings: int = 8192,
        quant_config: QuantizationConfig | None = None,
        bias: bool = False,
        bias_o_proj: bool = False,
        cache_config: CacheConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.total_num_heads = num_heads
        self.total_num_kv_heads = num_kv_heads
        self.head_dim = getattr(config, "head_dim", None) or hidden_size // num_heads
        self.qkv_proj = QKVParallelLinear(
            hidden_size,
            self.head_dim,
            num_heads,
            num_kv_heads,
            bias=bias,
            quant_config=quant_config,
            prefix=f"{prefix}.qkv_proj",
        )
        # Heads of this tensor-parallel rank.
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scaling = self.head_dim**-0.5
        self.o_proj = RowParallelLinear(
            num_heads * self.head_dim,
            hidden_size,
            bias=bias_o_proj,
            quant_config=quant_config,
            prefix=f"{prefix}.o_proj",
        )
        base, rope_scaling = get_rope_parameters(config)
        self.rotary_emb = get_rope(
            self.head_dim,
            rotary_dim=self.head_dim,
            max_position=max_position_embeddings,
            base=base,
            is_neox_style=True,
            rope_scaling=rope_scaling,
            partial_rotary_factor=getattr(config, "partial_rotary_factor", 1.0),
        )
        self.attn = Attention(
            self.num_heads,
            self.head_dim,
            self.scaling,
            num_kv_heads=self.num_kv_heads,
            cache_config=cache_config,
            quant_config=quant_config,
            per_layer_sliding_window=get_layer_sliding_window(config, extract_layer_index(prefix)),
            prefix=f"{prefix}.attn",
        )

    def _qk_transform(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Hook between projection and rotary (Qwen3's per-head norms)."""
        return q, k

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        """positions [T], hidden_states [T, hidden] -> [T, hidden]."""
        qkv, _ = self.qkv_proj(hidden_states)  # [T, q_size + 2 * kv_size]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self._qk_transform(q, k)
        q, k = self.rotary_emb(positions, q, k)
        attn_output = self.attn(q, k, v)  # [T, q_size]
        output, _ = self.o_proj(attn_output)
        return output


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(.)); the residual
    stream is carried separately so each norm can fuse the residual add."""

    attention_cls: ClassVar[type[LlamaAttention]] = LlamaAttention

    def __init__(
        self, vllm_config: VllmConfig, prefix: str = "", config: PretrainedConfig | None = None
    ) -> None:
        super().__init__()
        assert vllm_config.model_config is not None
        config = config or vllm_config.model_config.hf_text_config
        self.hidden_size = config.hidden_size
        qkv_bias, o_bias = self._attention_biases(config)
        self.self_attn = self.attention_cls(
            config=config,
            hidden_size=self.hidden_size,
            num_heads=config.num_attention_heads,
            num_kv_heads=getattr(config, "num_key_value_heads", config.num_attention_heads),
            max_position_embeddings=getattr(config, "max_position_embeddings", 8192),
            bias=qkv_bias,
            bias_o_proj=o_bias,
            cache_config=vllm_config.cache_config,
            quant_config=vllm_config.quant_config,
            prefix=f"{prefix}.self_attn",
        )
        self.mlp = self._make_mlp(config, f"{prefix}.mlp", vllm_config.quant_config)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    @classmethod
    def _attention_biases(cls, config: PretrainedConfig) -> tuple[bool, bool]:
        """(qkv bias, o_proj bias); Llama ties both to `attention_bias`."""
        bias = bool(getattr(config, "attention_bias", False) or getattr(config, "bias", False))
        return bias, bias

    @classmethod
    def _make_mlp(
        cls, config: PretrainedConfig, prefix: str, quant_config: QuantizationConfig | None = None
    ) -> nn.Module:
        """The block's MLP: dense SwiGLU here; MoE models build their expert block."""
        return LlamaMLP(
            config.hidden_size,
            config.intermediate_size,
            config.hidden_act,
            quant_config=quant_config,
            bias=bool(getattr(config, "mlp_bias", False)),
            prefix=prefix,
        )

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden_states, residual = norm_with_residual(self.input_layernorm, hidden_states, residual)
        hidden_states = self.self_attn(positions=positions, hidden_states=hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class LlamaModel(nn.Module, EagleModelMixin):
    """Embeddings, the decoder layers and the final norm. Under pipeline
    parallelism a stage builds only its layers; the embedding lives on the
    first stage and the final norm on the last. With EAGLE-3 depths set
    (`aux_hidden_state_layers`), forward also returns the residual stream at
    those depths."""

    def __init__(
        self,
        *,
        vllm_config: VllmConfig,
        prefix: str = "",
        layer_type: type[nn.Module] = LlamaDecoderLayer,
    ) -> None:
        super().__init__()
        assert vllm_config.model_config is not None
        config = vllm_config.model_config.hf_text_config
        self.config = config
        self.vocab_size = config.vocab_size
        pp_group = get_pp_group()
        # A tied LM head reads the embedding table, so the last stage keeps it too.
        tied = getattr(config, "tie_word_embeddings", False)
        self.embed_tokens: VocabParallelEmbedding | PPMissingLayer
        if pp_group.is_first_rank or (tied and pp_group.is_last_rank):
            self.embed_tokens = VocabParallelEmbedding(
                config.vocab_size,
                config.hidden_size,
                quant_config=vllm_config.quant_config,
                prefix=f"{prefix}.embed_tokens",
            )
        else:
            self.embed_tokens = PPMissingLayer()
        self.start_layer, self.end_layer, self.layers = make_layers(
            config.num_hidden_layers,
            lambda layer_prefix: layer_type(vllm_config=vllm_config, prefix=layer_prefix),
            prefix=f"{prefix}.layers",
        )
        self.norm = (
            RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            if pp_group.is_last_rank
            else PPMissingLayer()
        )
        self.make_empty_intermediate_tensors = make_empty_intermediate_tensors_factory(
            ["hidden_states", "residual"], config.hidden_size
        )

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors | tuple[torch.Tensor, list[torch.Tensor]]:
        """input_ids [T] (or inputs_embeds [T, hidden]; on later pipeline stages
        the previous stage's tensors), positions [T] -> [T, hidden], or the
        IntermediateTensors for the next stage; with EAGLE-3 depths set,
        (hidden [T, hidden], aux: one [T, hidden] per depth, shallowest first)."""
        pp_group = get_pp_group()
        if pp_group.is_first_rank:
            hidden_states = (
                inputs_embeds if inputs_embeds is not None else self.embed_tokens(input_ids)
            )
            residual = None
        else:
            assert intermediate_tensors is not None, "a later stage needs the previous one's"
            hidden_states = intermediate_tensors["hidden_states"]
            residual = intermediate_tensors["residual"]
        aux = self._maybe_add_hidden_state([], 0, hidden_states, residual)
        for depth, layer in enumerate(self.layers[self.start_layer : self.end_layer], start=1):
            hidden_states, residual = layer(positions, hidden_states, residual)
            self._maybe_add_hidden_state(aux, depth, hidden_states, residual)
        if not pp_group.is_last_rank:
            assert residual is not None  # every stage runs a layer (get_pp_indices)
            return IntermediateTensors({"hidden_states": hidden_states, "residual": residual})
        if residual is None:  # no layers
            hidden_states = self.norm(hidden_states)
        else:
            hidden_states, _ = self.norm(hidden_states, residual)
        return (hidden_states, aux) if aux else hidden_states

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Checkpoint names relative to the body ("layers.0.self_attn.q_proj.weight")."""
        return load_stacked_weights(self, weights, LlamaForCausalLM.stacked_params_mapping)


class LlamaForCausalLM(CausalLMBase, SupportsPP, SupportsLoRA, SupportsEagle, SupportsEagle3):
    """The body plus the LM head (on the last pipeline stage); the model
    contract the runner relies on. An EAGLE / EAGLE-3 target (Qwen2/3 and
    Mistral through this class too)."""

    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }
    # LoRA targets besides the linear layers (upstream's roles).
    embedding_modules: ClassVar[dict[str, str]] = {
        "embed_tokens": "input_embeddings",
        "lm_head": "output_embeddings",
    }
    # (fused param, checkpoint name, shard id)
    stacked_params_mapping: ClassVar[list[tuple[str, str, str | int]]] = [
        (".qkv_proj", ".q_proj", "q"),
        (".qkv_proj", ".k_proj", "k"),
        (".qkv_proj", ".v_proj", "v"),
        (".gate_up_proj", ".gate_proj", 0),
        (".gate_up_proj", ".up_proj", 1),
    ]

    def __init__(
        self,
        *,
        vllm_config: VllmConfig,
        prefix: str = "",
        layer_type: type[nn.Module] = LlamaDecoderLayer,
    ) -> None:
        super().__init__()
        assert vllm_config.model_config is not None
        config = vllm_config.model_config.hf_text_config
        self.config = config
        self.model = LlamaModel(
            vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"), layer_type=layer_type
        )
        self.init_lm_head(
            config,
            prefix,
            self.model.embed_tokens,
            tie=getattr(config, "tie_word_embeddings", False),
            scale=getattr(config, "logit_scale", 1.0),
            quant_config=vllm_config.quant_config,
        )
        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors

    def get_input_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Older upstream name of `embed_input_ids`."""
        return self.embed_input_ids(input_ids)


# HF's LlamaForSequenceClassification: the body plus a bias-free `score` head
# over the last token (runner="pooling"; see models/adapters.py).
LlamaForSequenceClassification = as_seq_cls_model(LlamaForCausalLM)
