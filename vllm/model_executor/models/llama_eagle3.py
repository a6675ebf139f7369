"""EAGLE-3 draft head for Llama-family targets (upstream:
vllm/model_executor/models/llama_eagle3.py; Qwen2/Qwen3 targets use it too).

The target hands out its residual stream at A depths (default 3), each
[T, Ht]; the proposer concatenates them and `combine_hidden_states` folds
them to [T, H] with `fc` ([H, A*Ht], no bias; optional norms before). The
head's first layer ("midlayer" in EAGLE-3 checkpoints) attends over
cat(input_layernorm(embed(token)), hidden_norm(hidden)) [T, 2H] (its
qkv_proj takes 2H inputs); later layers are plain Llama layers. The output
goes through `norm`: the normed value feeds the LM head, the pre-norm sum
(post-norm with `norm_output`) is the next pass's hidden input.

The LM head may cover a smaller draft vocabulary: `d2t[i]` is the offset
from draft id i to its target id (target = i + d2t[i]); logits of target ids
outside the draft vocabulary are -inf.

Checkpoint names: fc.weight, midlayer.{hidden_norm, input_layernorm,
post_attention_layernorm, self_attn.q/k/v/o_proj, mlp.gate/up/down_proj}.weight
(or layers.N.*), norm.weight, lm_head.weight, d2t, t2d (unused), optionally
embed_tokens.weight (else the target's).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from transformers import PretrainedConfig

from vllm.config import VllmConfig
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import QKVParallelLinear, ReplicatedLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from vllm.model_executor.models.interfaces import SupportsEagleBase
from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from vllm.model_executor.models.llama_eagle import (
    eagle_draft_config,
    eagle_start_layer_id,
    record_eagle_weight,
    shared_from_target,
)
from vllm.model_executor.models.utils import (
    load_stacked_weights,
    maybe_prefix,
    norm_with_residual,
)


class Eagle3LlamaDecoderLayer(LlamaDecoderLayer):
    """Layer 0 reads cat(embeds, hidden) [T, 2H]; later layers only hidden."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        prefix: str = "",
        config: PretrainedConfig | None = None,
        layer_idx: int = 0,
    ) -> None:
        super().__init__(vllm_config, prefix=prefix, config=config)
        assert config is not None
        attn = self.self_attn
        attn.qkv_proj = QKVParallelLinear(
            2 * self.hidden_size if layer_idx == 0 else self.hidden_size,
            attn.head_dim,
            attn.total_num_heads,
            attn.total_num_kv_heads,
            bias=bool(getattr(config, "attention_bias", False)),
            prefix=f"{prefix}.self_attn.qkv_proj",
        )
        self.hidden_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.layer_idx = layer_idx
        self.norm_before_residual = bool(getattr(config, "norm_before_residual", False))

    def forward(  # type: ignore[override]
        self,
        positions: torch.Tensor,
        embeds: torch.Tensor,
        hidden_states: torch.Tensor,
        residual: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """embeds, hidden_states [T, H] -> (mlp output, residual) [T, H]."""
        if self.layer_idx == 0:
            normed = self.hidden_norm(hidden_states)
            # The residual stream starts at the hidden input, normed or not.
            residual = normed if self.norm_before_residual else hidden_states
            hidden_states = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        else:
            hidden_states, residual = norm_with_residual(
                self.input_layernorm, hidden_states, residual
            )
        hidden_states = self.self_attn(positions=positions, hidden_states=hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


def _num_aux_hidden_states(config: PretrainedConfig) -> int:
    eagle_config = getattr(config, "eagle_config", None) or {}
    n = getattr(config, "num_aux_hidden_states", None)
    if n is None:
        layer_ids = eagle_config.get("eagle_aux_hidden_state_layer_ids") or getattr(
            config, "eagle_aux_hidden_state_layer_ids", None
        )
        n = len(layer_ids) if layer_ids else 3
    return int(n)


class Eagle3LlamaModel(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, start_layer_id: int = 0, prefix: str = ""):
        super().__init__()
        self.config = config = eagle_draft_config(vllm_config)
        eagle_config = getattr(config, "eagle_config", None) or {}
        self.use_aux_hidden_state = bool(eagle_config.get("use_aux_hidden_state", True))
        self.norm_before_fc = bool(
            eagle_config.get("norm_before_fc", getattr(config, "norm_before_fc", False))
        )
        self.norm_output = bool(getattr(config, "norm_output", False))
        eps = config.rms_norm_eps
        self.embed_tokens = VocabParallelEmbedding(
            config.vocab_size, config.hidden_size, prefix=maybe_prefix(prefix, "embed_tokens")
        )
        self.layers = nn.ModuleList(
            Eagle3LlamaDecoderLayer(
                vllm_config,
                prefix=maybe_prefix(prefix, f"layers.{i + start_layer_id}"),
                config=config,
                layer_idx=i,
            )
            for i in range(config.num_hidden_layers)
        )
        self.num_aux_hidden_states = _num_aux_hidden_states(config)
        target_hidden = getattr(config, "target_hidden_size", None) or config.hidden_size
        self.fc_input_size = target_hidden * self.num_aux_hidden_states
        self.input_norm = RMSNorm(self.fc_input_size, eps=eps) if self.norm_before_fc else None
        self.fc_norm = (
            nn.ModuleList(
                RMSNorm(target_hidden, eps=eps) for _ in range(self.num_aux_hidden_states)
            )
            if getattr(config, "fc_norm", False)
            else None
        )
        self.fc = (
            ReplicatedLinear(
                self.fc_input_size,
                config.hidden_size,
                bias=False,
                prefix=maybe_prefix(prefix, "fc"),
            )
            if self.use_aux_hidden_state
            else None
        )
        self.norm = RMSNorm(config.hidden_size, eps=eps)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        input_embeds: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids [T], positions [T], hidden_states [T, H] (combined target
        states, or the previous pass's output) -> (normed [T, H] for the LM
        head, the next pass's hidden input [T, H])."""
        embeds = self.embed_tokens(input_ids) if input_embeds is None else input_embeds
        if hidden_states.shape[-1] != embeds.shape[-1]:
            raise ValueError(
                f"hidden_states width {hidden_states.shape[-1]} != embedding width "
                f"{embeds.shape[-1]} (combine the target's states first)."
            )
        residual: torch.Tensor | None = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, embeds, hidden_states, residual)
        assert residual is not None
        normed, prenorm = self.norm(hidden_states, residual)
        return normed, normed if self.norm_output else prenorm

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Names relative to the body; "midlayer." is layer 0."""
        renamed = (
            (name.replace("midlayer.", "layers.0.", 1) if name.startswith("midlayer.") else name, w)
            for name, w in weights
        )
        return load_stacked_weights(self, renamed, LlamaForCausalLM.stacked_params_mapping)


class Eagle3LlamaForCausalLM(nn.Module, SupportsEagleBase):
    """The EAGLE-3 head, its LM head over the draft vocabulary and the
    draft -> target id map."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        self.config = config = eagle_draft_config(vllm_config)
        if getattr(config, "draft_vocab_size", None) is None:
            config.draft_vocab_size = config.vocab_size
        spec = vllm_config.speculative_config
        if spec is not None and getattr(spec, "parallel_drafting", False):
            raise NotImplementedError("EAGLE-3 parallel drafting (P-EAGLE) is not built.")
        self.has_own_lm_head = False
        self.has_own_embed_tokens = False
        self.model = Eagle3LlamaModel(
            vllm_config=vllm_config,
            prefix=maybe_prefix(prefix, "model"),
            start_layer_id=eagle_start_layer_id(vllm_config),
        )
        self.lm_head = ParallelLMHead(
            config.draft_vocab_size, config.hidden_size, prefix=maybe_prefix(prefix, "lm_head")
        )
        self.logits_processor = LogitsProcessor(
            config.draft_vocab_size, scale=getattr(config, "logit_scale", 1.0)
        )
        # d2t: target id of draft id i is i + offset[i] (zeros: the identity).
        self.draft_id_to_target_id = nn.Parameter(
            torch.zeros(config.draft_vocab_size, dtype=torch.long), requires_grad=False
        )
        # Whether logits need the scatter to target ids (set again on load).
        self.maps_vocab = config.draft_vocab_size != config.vocab_size

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model(input_ids, positions, hidden_states, inputs_embeds)

    def combine_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """cat(aux states) [T, A*Ht] -> [T, H] (unchanged without aux states)."""
        model = self.model
        if model.fc is None:
            return hidden_states
        if model.input_norm is not None:
            hidden_states = model.input_norm(hidden_states)
        if model.fc_norm is not None:
            chunks = hidden_states.chunk(model.num_aux_hidden_states, dim=-1)
            hidden_states = torch.cat([n(c) for n, c in zip(model.fc_norm, chunks)], dim=-1)
        out, _ = model.fc(hidden_states)
        return out

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden_states [N, H] -> logits [N, vocab_size]: the draft vocabulary's
        logits at their target ids, -inf elsewhere."""
        logits = self.logits_processor(self.lm_head, hidden_states)  # [N, draft_vocab]
        if not self.maps_vocab:
            return logits
        targets = (
            torch.arange(self.config.draft_vocab_size, device=logits.device)
            + self.draft_id_to_target_id
        )
        full = logits.new_full((logits.shape[0], self.config.vocab_size), float("-inf"))
        full[:, targets] = logits
        return full

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """EAGLE-3 names (see the module docstring). Returns the loaded
        parameters plus those shared from the target (see llama_eagle.py),
        the d2t map when absent (identity) and layers the config disables."""
        body: list[tuple[str, torch.Tensor]] = []
        loaded: set[str] = set()
        for name, tensor in weights:
            if name in ("t2d", "d2t"):
                if name == "d2t":
                    if tensor.shape != self.draft_id_to_target_id.shape:
                        raise ValueError(
                            f"d2t has shape {tuple(tensor.shape)}; draft_vocab_size is "
                            f"{self.config.draft_vocab_size}."
                        )
                    self.draft_id_to_target_id.data.copy_(tensor)
                loaded.add("draft_id_to_target_id")
                continue
            record_eagle_weight(self, name)
            if name.startswith("lm_head."):
                self.lm_head.weight_loader(self.lm_head.weight, tensor)
                loaded.add("lm_head.weight")
            else:
                body.append((name.removeprefix("model."), tensor))
        loaded |= {f"model.{n}" for n in self.model.load_weights(body)}
        # No d2t: the identity map (a draft vocabulary that is a prefix).
        loaded.add("draft_id_to_target_id")
        self.maps_vocab = self.config.draft_vocab_size != self.config.vocab_size or bool(
            self.draft_id_to_target_id.any()
        )
        return loaded | shared_from_target(self)
