"""Architecture name -> model class, imported lazily (upstream:
vllm/model_executor/models/registry.py).

Importing a model module pulls in torch layers, so the table holds
(module, class) names and classes are imported only when a model is built or
inspected.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch.nn as nn

# arch -> (module under vllm.model_executor.models, class name)
_TEXT_GENERATION_MODELS: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "OPTForCausalLM": ("opt", "OPTForCausalLM"),
    "GPT2LMHeadModel": ("gpt2", "GPT2LMHeadModel"),
    "Phi3ForCausalLM": ("phi3", "Phi3ForCausalLM"),
    "Gemma2ForCausalLM": ("gemma2", "Gemma2ForCausalLM"),
    "MixtralForCausalLM": ("mixtral", "MixtralForCausalLM"),
    "Qwen2MoeForCausalLM": ("qwen2_moe", "Qwen2MoeForCausalLM"),
    "GraniteMoeForCausalLM": ("granitemoe", "GraniteMoeForCausalLM"),
    "DeepseekV2ForCausalLM": ("deepseek_v2", "DeepseekV2ForCausalLM"),
    "MambaForCausalLM": ("mamba", "MambaForCausalLM"),
    "Qwen3_5ForCausalLM": ("qwen3_5", "Qwen3_5ForCausalLM"),
}

# Pooling models. The decoder families' *ForSequenceClassification classes are
# `as_seq_cls_model` of their causal LM (models/adapters.py).
_POOLING_MODELS: dict[str, tuple[str, str]] = {
    "LlamaForSequenceClassification": ("llama", "LlamaForSequenceClassification"),
    "Qwen2ForSequenceClassification": ("qwen2", "Qwen2ForSequenceClassification"),
    "Qwen3ForSequenceClassification": ("qwen3", "Qwen3ForSequenceClassification"),
    # Base-model checkpoints (what sentence-transformers saves): the causal LM
    # class, converted by `--convert embed` (the "Model" suffix's default).
    "LlamaModel": ("llama", "LlamaForCausalLM"),
    "Qwen2Model": ("qwen2", "Qwen2ForCausalLM"),
    "Qwen3Model": ("qwen3", "Qwen3ForCausalLM"),
    "BertModel": ("bert", "BertEmbeddingModel"),
    "BertForSequenceClassification": ("bert", "BertForSequenceClassification"),
    "RobertaModel": ("roberta", "RobertaEmbeddingModel"),
    "RobertaForSequenceClassification": ("roberta", "RobertaForSequenceClassification"),
    "XLMRobertaModel": ("roberta", "RobertaEmbeddingModel"),
    "XLMRobertaForSequenceClassification": ("roberta", "RobertaForSequenceClassification"),
}

# Draft heads for speculative decoding (built only as a speculative_config
# draft; EAGLE-1 checkpoints say "LlamaForCausalLM" and are renamed to
# "EagleLlamaForCausalLM" by vllm/config/spec_draft.py, EAGLE-3 ones say
# "LlamaForCausalLMEagle3" or are renamed to "Eagle3LlamaForCausalLM").
_SPECULATIVE_DECODING_MODELS: dict[str, tuple[str, str]] = {
    "EagleLlamaForCausalLM": ("llama_eagle", "EagleLlamaForCausalLM"),
    "Eagle3LlamaForCausalLM": ("llama_eagle3", "Eagle3LlamaForCausalLM"),
    "LlamaForCausalLMEagle3": ("llama_eagle3", "Eagle3LlamaForCausalLM"),
}

_VLLM_MODELS = {**_TEXT_GENERATION_MODELS, **_POOLING_MODELS, **_SPECULATIVE_DECODING_MODELS}


@dataclass(frozen=True)
class _ModelInfo:
    """What the config needs to know about a model class, read from its
    class attributes (the interfaces in models/interfaces.py)."""

    architecture: str
    is_text_generation_model: bool
    is_pooling_model: bool
    supports_pp: bool
    has_inner_state: bool
    is_attention_free: bool
    is_hybrid: bool
    has_noops: bool = False
    # Pooling models: the pooling type without a --pooler-config / ST config,
    # and whether it scores text pairs (a cross-encoder: LLM.score).
    default_pooling_type: str = "LAST"
    supports_cross_encoding: bool = False

    @staticmethod
    def from_model_cls(arch: str, model_cls: type[nn.Module]) -> _ModelInfo:
        def flag(name: str) -> bool:
            return bool(getattr(model_cls, name, False))

        return _ModelInfo(
            architecture=arch,
            is_text_generation_model=arch in _TEXT_GENERATION_MODELS
            or arch in _SPECULATIVE_DECODING_MODELS,
            is_pooling_model=flag("is_pooling_model"),
            supports_pp=flag("supports_pp"),
            has_inner_state=flag("has_inner_state"),
            is_attention_free=flag("is_attention_free"),
            is_hybrid=flag("is_hybrid"),
            default_pooling_type=str(getattr(model_cls, "default_pooling_type", "LAST")),
            supports_cross_encoding=flag("supports_cross_encoding"),
        )


class _ModelRegistry:
    def __init__(self, models: dict[str, tuple[str, str]]) -> None:
        self.models = models

    def get_supported_archs(self) -> list[str]:
        return sorted(self.models)

    @cache  # noqa: B019 - the registry is a process-wide singleton
    def _load_model_cls(self, arch: str) -> type[nn.Module]:
        module_name, cls_name = self.models[arch]
        module = importlib.import_module(f"vllm.model_executor.models.{module_name}")
        return getattr(module, cls_name)

    def _normalize(self, architectures: str | list[str] | None) -> list[str]:
        if isinstance(architectures, str):
            architectures = [architectures]
        if not architectures:
            raise ValueError("The model config names no architecture; cannot pick a model class.")
        return list(architectures)

    def _raise_unsupported(self, architectures: list[str]) -> None:
        raise ValueError(
            f"Model architectures {architectures} are not supported for now. "
            f"Supported architectures: {self.get_supported_archs()}"
        )

    def inspect_model_cls(
        self, architectures: str | list[str] | None, model_config: Any = None
    ) -> tuple[_ModelInfo, str]:
        for arch in self._normalize(architectures):
            if arch in self.models:
                return _ModelInfo.from_model_cls(arch, self._load_model_cls(arch)), arch
        self._raise_unsupported(self._normalize(architectures))
        raise AssertionError  # unreachable

    def resolve_model_cls(
        self, architectures: str | list[str] | None, model_config: Any = None
    ) -> tuple[type[nn.Module], str]:
        for arch in self._normalize(architectures):
            if arch in self.models:
                return self._load_model_cls(arch), arch
        self._raise_unsupported(self._normalize(architectures))
        raise AssertionError  # unreachable

    def is_text_generation_model(
        self, architectures: str | list[str] | None, model_config: Any = None
    ) -> bool:
        return self.inspect_model_cls(architectures, model_config)[0].is_text_generation_model

    def is_hybrid_model(self, architectures, model_config: Any = None) -> bool:
        return self.inspect_model_cls(architectures, model_config)[0].is_hybrid

    def is_attention_free_model(self, architectures, model_config: Any = None) -> bool:
        return self.inspect_model_cls(architectures, model_config)[0].is_attention_free

    def register_model(self, model_arch: str, model_cls: type[nn.Module] | str) -> None:
        """Register an out-of-tree model: a class, or "module.path:ClassName"."""
        if isinstance(model_cls, str):
            module, _, cls_name = model_cls.partition(":")
            model_cls = getattr(importlib.import_module(module), cls_name)
        self.models[model_arch] = ("__oot__", model_arch)
        # The cache lives on the base class's method (subclasses may override it).
        _ModelRegistry._load_model_cls.cache_clear()
        _OOT_MODELS[model_arch] = model_cls  # type: ignore[assignment]


_OOT_MODELS: dict[str, type[nn.Module]] = {}


class _Registry(_ModelRegistry):
    def _load_model_cls(self, arch: str) -> type[nn.Module]:  # type: ignore[override]
        if arch in _OOT_MODELS:
            return _OOT_MODELS[arch]
        return super()._load_model_cls(arch)


ModelRegistry = _Registry(dict(_VLLM_MODELS))
