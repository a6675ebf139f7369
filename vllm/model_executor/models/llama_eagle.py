"""EAGLE-1/2 draft head for Llama-family targets (upstream:
vllm/model_executor/models/llama_eagle.py; Qwen2/Qwen3 targets use it too).

The head predicts the token after `input_ids[i]` from that token's embedding
and the target's last hidden state of the token before it:

    h = fc(cat(embed(input_ids), hidden_states))      fc: [H, 2H], no bias
    h = decoder layers (layer 0 without its input RMSNorm, as EAGLE trains it)
    return h + residual (no final norm) for both the logits and the next pass

Checkpoint names (EAGLE's layout, no "model." prefix): fc.weight,
layers.0.{self_attn.q/k/v/o_proj, mlp.gate/up/down_proj,
post_attention_layernorm}.weight, optionally embed_tokens.weight and
lm_head.weight. What it lacks is shared from the target by the proposer
(`has_own_embed_tokens` / `has_own_lm_head` record what it had).

T = tokens of the pass, H = hidden size.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig

from vllm.config import VllmConfig
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from vllm.model_executor.models.interfaces import SupportsEagleBase
from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from vllm.model_executor.models.utils import load_stacked_weights, maybe_prefix


def eagle_draft_config(vllm_config: VllmConfig) -> PretrainedConfig:
    """The draft head's HF config (the speculative config's draft model)."""
    spec = vllm_config.speculative_config
    if spec is None or spec.draft_model_config is None:
        raise ValueError("An EAGLE head is built from speculative_config.draft_model_config.")
    return spec.draft_model_config.hf_config


def eagle_start_layer_id(vllm_config: VllmConfig) -> int:
    """The target's layer count: draft layer i registers its attention as layer
    (target layers + i), so its name never collides with the target's."""
    spec = vllm_config.speculative_config
    target = getattr(spec, "target_model_config", None) or vllm_config.model_config
    assert target is not None
    return target.get_total_num_hidden_layers()


class EagleLlamaDecoderLayer(LlamaDecoderLayer):
    """A Llama decoder layer; the first one drops its input RMSNorm (the fc
    output enters attention directly, as in EAGLE's training code)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        disable_input_layernorm: bool,
        prefix: str = "",
        config: PretrainedConfig | None = None,
    ) -> None:
        super().__init__(vllm_config, prefix=prefix, config=config)
        if disable_input_layernorm:
            self.input_layernorm = nn.Identity()  # type: ignore[assignment]


class EagleLlamaModel(nn.Module):
    """embed_tokens, fc and the decoder layers of the EAGLE head."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", start_layer_id: int = 0):
        super().__init__()
        self.config = config = eagle_draft_config(vllm_config)
        self.vocab_size = config.vocab_size
        self.embed_tokens = VocabParallelEmbedding(
            config.vocab_size, config.hidden_size, prefix=maybe_prefix(prefix, "embed_tokens")
        )
        self.layers = nn.ModuleList(
            EagleLlamaDecoderLayer(
                vllm_config,
                disable_input_layernorm=i == 0,
                prefix=maybe_prefix(prefix, f"layers.{i + start_layer_id}"),
                config=config,
            )
            for i in range(config.num_hidden_layers)
        )
        self.fc = ReplicatedLinear(
            2 * config.hidden_size,
            config.hidden_size,
            bias=False,
            prefix=maybe_prefix(prefix, "fc"),
        )

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids [T], positions [T], hidden_states [T, H] (the target's, or
        this head's previous output) -> (h [T, H], h) before any final norm."""
        embeds = self.embed_tokens(input_ids)  # [T, H]
        hidden_states, _ = self.fc(torch.cat((embeds, hidden_states), dim=-1))
        residual: torch.Tensor | None = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        assert residual is not None
        hidden_states = hidden_states + residual
        return hidden_states, hidden_states

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_stacked_weights(self, weights, LlamaForCausalLM.stacked_params_mapping)


def record_eagle_weight(model: SupportsEagleBase, name: str) -> None:
    """Upstream's process_eagle_weight: note a trained LM head / embedding."""
    if "lm_head" in name:
        model.has_own_lm_head = True
    if "embed_tokens" in name:
        model.has_own_embed_tokens = True


class EagleLlamaForCausalLM(nn.Module, SupportsEagleBase):
    """The EAGLE head plus an LM head over the full vocabulary (the target's
    unless the checkpoint trains its own)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        self.config = config = eagle_draft_config(vllm_config)
        if getattr(config, "draft_vocab_size", None) is None:
            config.draft_vocab_size = config.vocab_size
        self.has_own_lm_head = False
        self.has_own_embed_tokens = False
        self.model = EagleLlamaModel(
            vllm_config=vllm_config,
            prefix=maybe_prefix(prefix, "model"),
            start_layer_id=eagle_start_layer_id(vllm_config),
        )
        self.lm_head = ParallelLMHead(
            config.vocab_size, config.hidden_size, prefix=maybe_prefix(prefix, "lm_head")
        )
        self.logits_processor = LogitsProcessor(
            config.vocab_size, scale=getattr(config, "logit_scale", 1.0)
        )

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if inputs_embeds is not None:
            raise NotImplementedError(f"{type(self).__name__} does not take inputs_embeds.")
        return self.model(input_ids, positions, hidden_states)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden_states [N, H] -> logits [N, vocab_size]."""
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """EAGLE names (no "model." prefix). Returns the loaded parameters plus
        those the checkpoint lacks and the proposer shares from the target
        (embed_tokens, lm_head): `EagleProposer.load_model` always replaces
        them when `has_own_*` is False."""
        body: list[tuple[str, torch.Tensor]] = []
        loaded: set[str] = set()
        for name, tensor in weights:
            record_eagle_weight(self, name)
            if name.startswith("lm_head."):
                self.lm_head.weight_loader(self.lm_head.weight, tensor)
                loaded.add("lm_head.weight")
            else:
                body.append((name.removeprefix("model."), tensor))
        loaded |= {f"model.{n}" for n in self.model.load_weights(body)}
        return loaded | shared_from_target(self)


def shared_from_target(model: nn.Module) -> set[str]:
    """Parameter names an EAGLE head takes from its target (not in its checkpoint)."""
    names: set[str] = set()
    if not getattr(model, "has_own_embed_tokens", False):
        names.add("model.embed_tokens.weight")
    if not getattr(model, "has_own_lm_head", False):
        names.add("lm_head.weight")
    return names


def _base_layer(module: Any) -> Any:
    """The plain layer under a LoRA wrapper: the head drafts with the base
    model's table (its drafts are verified by the target under its adapter)."""
    return getattr(module, "base_layer", module)


def share_target_embeddings(head: nn.Module, target: nn.Module) -> bool:
    """Give an EAGLE head the target's input embedding when its checkpoint
    had none (upstream shares the module). Returns whether it was shared."""
    if getattr(head, "has_own_embed_tokens", False):
        return False
    embed = _base_layer(getattr(getattr(target, "model", None), "embed_tokens", None))
    if not isinstance(embed, VocabParallelEmbedding):
        raise ValueError(
            f"The EAGLE head has no embed_tokens and the target {type(target).__name__} "
            "exposes none to share (model.embed_tokens)."
        )
    head.model.embed_tokens = embed  # type: ignore[union-attr]
    return True


def share_target_lm_head(head: nn.Module, target: nn.Module) -> bool:
    """Give an EAGLE head the target's LM head when its checkpoint had none
    (EAGLE-3 only when its vocabulary is the target's). Returns whether it
    was shared."""
    if getattr(head, "has_own_lm_head", False):
        return False
    lm_head = _base_layer(getattr(target, "lm_head", None))
    own: Any = head.lm_head
    # Shapes from the attributes: a loaded CPU head keeps only its packed weight.
    shape = (own.org_vocab_size, own.embedding_dim)
    if (
        not isinstance(lm_head, ParallelLMHead)
        or (
            lm_head.org_vocab_size,
            lm_head.embedding_dim,
        )
        != shape
    ):
        raise ValueError(
            f"The EAGLE head has no lm_head and the target's ({type(target).__name__}) "
            f"cannot serve it (draft LM head [vocab, hidden] = {list(shape)})."
        )
    head.lm_head = lm_head  # type: ignore[union-attr]
    return True
