"""Capability markers a model class declares (upstream:
vllm/model_executor/models/interfaces.py).

A model opts in by inheriting the marker; the registry reads the class
attributes (`supports_pp`, `has_inner_state`, ...) without building the model.
Declare only what the model really implements.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch


class SupportsPP:
    """The model can be split into pipeline-parallel stages
    (`make_empty_intermediate_tensors`, `intermediate_tensors` in forward)."""

    supports_pp: ClassVar[Literal[True]] = True


class SupportsLoRA:
    """The model serves LoRA adapters (vllm/lora/model_manager.py): its linear
    layers, plus the modules named in `embedding_modules` (input embedding,
    LM head), can be wrapped by LoRA layers; `packed_modules_mapping` names
    the parts of each fused layer (qkv_proj -> q/k/v_proj) as peft adapters
    name them. A subclass whose layers do not all run through their forward
    (e.g. MLA's absorbed kv_b_proj) sets `supports_lora = False`."""

    supports_lora: ClassVar[bool] = True
    # Upstream's MoE adapter layouts (not built: experts are no LoRA target).
    is_3d_moe_weight: ClassVar[bool] = False
    is_non_gated_moe: ClassVar[bool] = False
    # Module-name suffix -> upstream's role ("input_embeddings" / "output_embeddings").
    embedding_modules: ClassVar[dict[str, str]] = {}
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {}
    # Module-name prefixes whose adapter tensors are skipped on load (e.g. "mtp.").
    lora_skip_prefixes: ClassVar[list[str]] = []


class HasInnerState:
    """The model keeps per-request state besides the KV cache (e.g. Mamba)."""

    has_inner_state: ClassVar[Literal[True]] = True


class IsAttentionFree:
    """The model has no attention layers (and so no KV cache)."""

    is_attention_free: ClassVar[Literal[True]] = True


class IsHybrid:
    """The model mixes attention with state-space / linear-attention layers."""

    is_hybrid: ClassVar[Literal[True]] = True


class EagleModelMixin:
    """A decoder body that can hand out the residual stream at chosen depths
    (EAGLE-3's auxiliary hidden states). Depth d is the stream entering layer
    d: 0 = the embeddings, num_layers = the last layer's output before the
    final norm; each value is hidden + residual, [T, hidden]."""

    aux_hidden_state_layers: tuple[int, ...] = ()

    def _set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
        self.aux_hidden_state_layers = tuple(layers)

    def _maybe_add_hidden_state(
        self,
        aux_hidden_states: list[torch.Tensor],
        layer_idx: int,
        hidden_states: torch.Tensor,
        residual: torch.Tensor | None,
    ) -> list[torch.Tensor]:
        if layer_idx in self.aux_hidden_state_layers:
            value = hidden_states if residual is None else hidden_states + residual
            aux_hidden_states.append(value)
        return aux_hidden_states


class SupportsEagleBase:
    """A drafter head may train its own LM head / embeddings; when its
    checkpoint lacks them, the proposer shares the target's."""

    has_own_lm_head: bool = False
    has_own_embed_tokens: bool = False


class SupportsEagle(SupportsEagleBase):
    """The model can be the target of EAGLE-1/2 drafting (the head reads its
    last hidden states and shares its embeddings / LM head)."""

    supports_eagle: ClassVar[Literal[True]] = True


class SupportsEagle3(SupportsEagleBase):
    """The model can be the target of EAGLE-3 drafting: its body (an
    `EagleModelMixin` under `.model`) returns (hidden_states, aux list) once
    `set_aux_hidden_state_layers` named the depths."""

    supports_eagle3: ClassVar[Literal[True]] = True

    def set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
        body = getattr(self, "model", self)
        if not isinstance(body, EagleModelMixin):
            raise TypeError(
                f"{type(self).__name__}'s body cannot output auxiliary hidden states for EAGLE-3."
            )
        body._set_aux_hidden_state_layers(layers)

    def get_eagle3_default_aux_hidden_state_layers(self) -> tuple[int, ...]:
        """Upstream's default depths: (2, num_layers // 2, num_layers - 3)."""
        body: Any = getattr(self, "model", self)
        num_layers = len(body.layers)
        return (2, num_layers // 2, num_layers - 3)


def _flag(model: Any, name: str) -> bool:
    return bool(getattr(model, name, False))


def supports_pp(model: Any) -> bool:
    return _flag(model, "supports_pp")


def supports_lora(model: Any) -> bool:
    return _flag(model, "supports_lora")


def has_inner_state(model: Any) -> bool:
    return _flag(model, "has_inner_state")


def is_attention_free(model: Any) -> bool:
    return _flag(model, "is_attention_free")


def is_hybrid(model: Any) -> bool:
    return _flag(model, "is_hybrid")


def supports_eagle(model: Any) -> bool:
    return _flag(model, "supports_eagle")


def supports_eagle3(model: Any) -> bool:
    return _flag(model, "supports_eagle3")


def supports_any_eagle(model: Any) -> bool:
    return supports_eagle(model) or supports_eagle3(model)
