"""GPT-2 (upstream: vllm/model_executor/models/gpt2.py).

Learned absolute positions, pre-LN blocks with biased LayerNorm, fused c_attn
(q, k, v), a GELU (tanh) MLP and a head tied to the token embeddings.

GPT-2 checkpoints store their projections as `Conv1D` weights, laid out
[in_features, out_features]; they are transposed on load into the
[out, in] layout the linear layers use.
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
    RowParallelLinear,
)
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import get_weight_loader
from vllm.model_executor.models.utils import (
    CausalLMBase,
    make_layers,
    maybe_prefix,
    single_stage_embeds,
)

# The projections stored as Conv1D ([in, out]) in GPT-2 checkpoints.
_CONV1D_WEIGHTS = ("c_attn.weight", "c_proj.weight", "c_fc.weight")
# Non-persistent causal-mask buffers some old checkpoints carry.
_MASK_BUFFERS = (".attn.bias", ".attn.masked_bias")


class GPT2Attention(nn.Module):
    def __init__(
        self, config: PretrainedConfig, cache_config: CacheConfig | None = None, prefix: str = ""
    ) -> None:
        super().__init__()
        if getattr(config, "scale_attn_by_inverse_layer_idx", False) or getattr(
            config, "reorder_and_upcast_attn", False
        ):
            raise NotImplementedError("GPT-2 per-layer attention scaling is not built.")
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = hidden // self.num_heads
        self.scale = self.head_dim**-0.5 if getattr(config, "scale_attn_weights", True) else 1.0
        # c_attn is the fused [q; k; v] projection (fused in the checkpoint too;
        # split on load so each rank gets its heads of q, k and v).
        self.c_attn = QKVParallelLinear(
            hidden, self.head_dim, self.num_heads, bias=True, prefix=f"{prefix}.c_attn"
        )
        self.c_proj = RowParallelLinear(hidden, hidden, bias=True, prefix=f"{prefix}.c_proj")
        self.attn = Attention(
            self.c_attn.num_heads,
            self.head_dim,
            self.scale,  # this rank's
            cache_config=cache_config,
            prefix=f"{prefix}.attn",
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.c_attn(hidden_states)  # [T, 3 * hidden]
        q, k, v = qkv.chunk(3, dim=-1)
        out, _ = self.c_proj(self.attn(q, k, v))
        return out


class GPT2MLP(nn.Module):
    def __init__(self, intermediate_size: int, config: PretrainedConfig, prefix: str = "") -> None:
        super().__init__()
        hidden = config.hidden_size
        self.c_fc = ColumnParallelLinear(
            hidden, intermediate_size, bias=True, prefix=f"{prefix}.c_fc"
        )
        self.c_proj = RowParallelLinear(
            intermediate_size, hidden, bias=True, prefix=f"{prefix}.c_proj"
        )
        act = config.activation_function
        if act not in ("gelu_new", "gelu_pytorch_tanh", "gelu", "relu"):
            raise ValueError(f"GPT-2 activation {act!r} is not supported.")
        self.act = (
            nn.ReLU() if act == "relu" else nn.GELU(approximate="none" if act == "gelu" else "tanh")
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        h, _ = self.c_fc(hidden_states)
        h, _ = self.c_proj(self.act(h))
        return h


class GPT2Block(nn.Module):
    def __init__(
        self, config: PretrainedConfig, cache_config: CacheConfig | None = None, prefix: str = ""
    ) -> None:
        super().__init__()
        hidden = config.hidden_size
        inner = config.n_inner if config.n_inner is not None else 4 * hidden
        self.ln_1 = nn.LayerNorm(hidden, eps=config.layer_norm_epsilon)
        self.attn = GPT2Attention(config, cache_config, prefix=f"{prefix}.attn")
        self.ln_2 = nn.LayerNorm(hidden, eps=config.layer_norm_epsilon)
        self.mlp = GPT2MLP(inner, config, prefix=f"{prefix}.mlp")

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = hidden_states + self.attn(self.ln_1(hidden_states))
        return hidden_states + self.mlp(self.ln_2(hidden_states))


class GPT2Model(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        assert vllm_config.model_config is not None
        config = vllm_config.model_config.hf_text_config
        self.config = config
        self.wte = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.wpe = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.wpe.weight.requires_grad_(False)
        self.start_layer, self.end_layer, self.h = make_layers(
            config.num_hidden_layers,
            lambda p: GPT2Block(config, vllm_config.cache_config, prefix=p),
            prefix=f"{prefix}.h",
        )
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.wte(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        inputs_embeds = single_stage_embeds(
            self, self.wte, input_ids, intermediate_tensors, inputs_embeds
        )
        hidden_states = inputs_embeds + self.wpe(positions)
        for block in self.h:
            hidden_states = block(hidden_states)
        return self.ln_f(hidden_states)


class GPT2LMHeadModel(CausalLMBase):
    packed_modules_mapping: dict[str, list[str]] = {}
    body_name: ClassVar[str] = "transformer"

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        assert vllm_config.model_config is not None
        config = vllm_config.model_config.hf_text_config
        self.config = config
        self.transformer = GPT2Model(
            vllm_config=vllm_config, prefix=maybe_prefix(prefix, "transformer")
        )
        # GPT-2 always ties its head to the token embeddings.
        self.init_lm_head(config, prefix, self.transformer.wte, tie=True)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, weight in weights:
            if name.startswith("lm_head.") or name.endswith(_MASK_BUFFERS):
                continue  # tied head; causal-mask buffers
            if not name.startswith("transformer."):
                name = f"transformer.{name}"  # original OpenAI checkpoints
            if name not in params:
                raise ValueError(f"Checkpoint weight {name!r} has no matching parameter.")
            if name.endswith(_CONV1D_WEIGHTS):
                weight = weight.t()  # Conv1D [in, out] -> [out, in]
            param = params[name]
            if ".c_attn." in name:  # [q; k; v] rows: load each as its shard
                for shard_id, part in zip("qkv", weight.chunk(3, dim=0)):
                    get_weight_loader(param)(param, part, shard_id)
            else:
                get_weight_loader(param)(param, weight)
            loaded.add(name)
        return loaded
