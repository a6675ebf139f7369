"""LoRA helpers: adapter tensor names, supported modules, adapter paths
(upstream: vllm/lora/utils.py).

peft names an adapter's tensors `base_model.model.<module>.lora_A.weight`
([rank, in]) and `...lora_B.weight` ([out, rank]); embeddings use
`<module>.lora_embedding_A` ([rank, vocab]) and `lora_embedding_B`
([hidden, rank]) with no `.weight`. The layer-replacement helpers
(`from_layer`, ...) arrive with the LoRA layers.
"""

from __future__ import annotations

import os
import re
from typing import Any, Protocol

from torch import nn

from vllm.lora.layers import (
    BaseLayerWithLoRA,
    ColumnParallelLinearWithLoRA,
    ColumnParallelLinearWithShardedLoRA,
    LogitsProcessorWithLoRA,
    MergedColumnParallelLinearVariableSliceWithLoRA,
    MergedColumnParallelLinearWithLoRA,
    MergedColumnParallelLinearWithShardedLoRA,
    MergedQKVParallelLinearWithLoRA,
    MergedQKVParallelLinearWithShardedLoRA,
    QKVParallelLinearWithLoRA,
    QKVParallelLinearWithShardedLoRA,
    ReplicatedLinearWithLoRA,
    RowParallelLinearWithLoRA,
    RowParallelLinearWithShardedLoRA,
    VocabParallelEmbeddingWithLoRA,
)
from vllm.lora.layers.utils import _get_lora_device
from vllm.model_executor.layers.linear import LinearBase
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead


class WeightNameMapper(Protocol):
    """What the loader needs of a model's `hf_to_vllm_mapper` (upstream's
    WeightsMapper): the vLLM name of a checkpoint name, None to drop it."""

    def _map_name(self, key: str) -> str | None: ...


def get_captured_lora_counts(max_loras: int, specialize: bool) -> list[int]:
    """Active-adapter counts to capture CUDA graphs for: powers of 2 up to
    max_loras plus max_loras + 1 when specialized, else [max_loras + 1]."""
    if not specialize:
        return [max_loras + 1]
    return [n for n in range(1, max_loras + 2) if (n & (n - 1)) == 0 or n == max_loras + 1]


_GLOBAL_LORA_ID = 0


def get_lora_id() -> int:
    """A fresh process-wide adapter id (1, 2, ...)."""
    global _GLOBAL_LORA_ID
    _GLOBAL_LORA_ID += 1
    return _GLOBAL_LORA_ID


# Tried in order by from_layer: the first whose can_replace_layer accepts the
# layer wraps it (the sharded classes only when fully_sharded_loras is set).
_all_lora_classes: tuple[type[BaseLayerWithLoRA], ...] = (
    VocabParallelEmbeddingWithLoRA,
    ColumnParallelLinearWithLoRA,
    MergedColumnParallelLinearWithLoRA,
    QKVParallelLinearWithLoRA,
    MergedQKVParallelLinearWithLoRA,
    RowParallelLinearWithLoRA,
    ReplicatedLinearWithLoRA,
    LogitsProcessorWithLoRA,
    ColumnParallelLinearWithShardedLoRA,
    QKVParallelLinearWithShardedLoRA,
    MergedColumnParallelLinearWithShardedLoRA,
    MergedColumnParallelLinearVariableSliceWithLoRA,
    MergedQKVParallelLinearWithShardedLoRA,
    RowParallelLinearWithShardedLoRA,
)


def from_layer(
    layer: nn.Module,
    max_loras: int,
    lora_config: Any,
    packed_modules_list: list[str],
    model_config: Any = None,
) -> nn.Module:
    """`layer` wrapped in the first LoRA class that accepts it, its
    `max_loras` slots allocated; `layer` itself when none does.
    `packed_modules_list`: the checkpoint modules packed into it (e.g.
    [q_proj, k_proj, v_proj] for qkv_proj, [qkv_proj] when not packed)."""
    for lora_cls in _all_lora_classes:
        # Keyword arguments: the can_replace decorators read lora_config.
        if lora_cls.can_replace_layer(
            source_layer=layer,
            lora_config=lora_config,
            packed_modules_list=packed_modules_list,
            model_config=model_config,
        ):
            wrapped = lora_cls(layer)  # type: ignore[call-arg]
            wrapped.create_lora_weights(max_loras, lora_config, model_config)
            return wrapped
    return layer


def from_layer_logits_processor(
    layer: LogitsProcessor,
    lm_head: ParallelLMHead,
    max_loras: int,
    lora_config: Any,
    model_config: Any = None,
) -> LogitsProcessorWithLoRA:
    """The model's LogitsProcessor wrapped for LM-head LoRA, sized from
    `lm_head` (hidden size, dtype, device), its slots allocated."""
    wrapped = LogitsProcessorWithLoRA(
        layer, lm_head.embedding_dim, lm_head.params_dtype, _get_lora_device(lm_head), None
    )
    wrapped.create_lora_weights(max_loras, lora_config, model_config)
    return wrapped


def replace_submodule(model: nn.Module, module_name: str, new_module: nn.Module) -> nn.Module:
    """Replace the submodule `module_name` (dotted) of `model` by `new_module`."""
    parent = model.get_submodule(".".join(module_name.split(".")[:-1]))
    setattr(parent, module_name.split(".")[-1], new_module)
    return new_module


def _map(name: str, weights_mapper: WeightNameMapper) -> str:
    mapped = weights_mapper._map_name(name)
    if mapped is None:
        raise ValueError("Mapped LoRA weight name cannot be None.")
    return mapped


def parse_fine_tuned_lora_name(
    name: str, weights_mapper: WeightNameMapper | None = None
) -> tuple[str, bool]:
    """Split a LoRA tensor name into (module name, is_lora_a).

    E.g. `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight` ->
    (`model.layers.0.self_attn.q_proj`, True). The `base_model.model.`
    prefix peft adds is dropped (a name without it keeps its prefix);
    `weights_mapper` renames the rest first. Anything that is not a LoRA A/B
    tensor (e.g. a `modules_to_save` copy or a bias) raises ValueError.
    """
    if name.startswith("base_model.model."):
        name = name.replace("base_model.model.", "")
        if weights_mapper:
            name = "base_model.model." + _map(name, weights_mapper)
    elif weights_mapper:
        name = _map(name, weights_mapper)

    start_index = 2 if name.startswith("base_model.model.") else 0
    parts = name.split(".")
    if parts[-1] == "weight" and len(parts) >= 2 and parts[-2] in ("lora_A", "lora_B"):
        return ".".join(parts[start_index:-2]), parts[-2] == "lora_A"
    if parts[-1] in ("lora_embedding_A", "lora_embedding_B"):
        return ".".join(parts[start_index:-1]), parts[-1] == "lora_embedding_A"
    raise ValueError(f"{name} is unsupported LoRA weight")


def is_base_embedding_weights(name: str) -> bool:
    """The base (not LoRA) input / output embedding weights, which peft saves
    alongside the adapter when it resized them."""
    return name.endswith((".embed_tokens.base_layer.weight", ".lm_head.base_layer.weight"))


def get_supported_lora_modules(model: nn.Module) -> list[str]:
    """Module-name suffixes LoRA can target in `model`: every linear layer's,
    plus the names a module lists in `embedding_modules`."""
    supported: set[str] = set()
    for name, module in model.named_modules():
        embedding_modules = getattr(module, "embedding_modules", None)
        if embedding_modules is not None:
            supported.update(embedding_modules)
        if isinstance(module, LinearBase):
            supported.add(name.split(".")[-1])
    return list(supported)


def is_supported_lora_module(module_name: str, supported_lora_modules: list[str]) -> bool:
    """Whether the dotted `module_name` ends with (or is) a supported suffix."""
    return any(
        re.match(rf".*\.{target}$", module_name) or target == module_name
        for target in supported_lora_modules
    )


def is_in_target_modules(
    module_name: str,
    target_modules: list[str] | None,
    packed_modules_mapping: dict[str, list[str]] | None = None,
) -> bool:
    """Whether a module passes LoRAConfig.target_modules (None: all do).

    A packed runtime module (`qkv_proj`) passes when one of its children
    (`q_proj`) is listed, and a child passes when its packed parent is.
    """
    if target_modules is None:
        return True
    targets = set(target_modules)
    suffix = module_name.split(".")[-1]
    if suffix in targets or module_name in targets:
        return True
    if not packed_modules_mapping:
        return False
    children = packed_modules_mapping.get(suffix)
    if children and any(child in targets for child in children):
        return True
    return any(
        suffix in kids and parent in targets for parent, kids in packed_modules_mapping.items()
    )


def get_adapter_absolute_path(lora_path: str) -> str:
    """The absolute local path of an adapter: absolute paths as given,
    `~` expanded, relative paths resolved when they exist. Hub repo ids are
    not downloaded (no hub access is built): such a path is returned as is,
    and loading it then fails as adapter not found."""
    if os.path.isabs(lora_path):
        return lora_path
    if lora_path.startswith("~"):
        return os.path.expanduser(lora_path)
    if os.path.exists(lora_path):
        return os.path.abspath(lora_path)
    return lora_path
