"""Swapping a model's modules for LoRA layers (upstream: the module surgery
in `LoRAModelManager._create_lora_modules`, vllm/lora/model_manager.py,
which calls `create_lora_modules` from here).

Every module LoRA can adapt and `LoRAConfig.target_modules` keeps is
replaced in the model by its LoRA layer (`from_layer`), `max_loras` slots
each; a module reachable under several names (tied, shared) is wrapped once
and the wrapper placed under each name. The LM head keeps its place: its
LoRA lives in the logits processor next to it (the head's weight is read
there, not through a forward), registered under the head's name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from vllm.config.lora import LoRAConfig
from vllm.logger import init_logger
from vllm.lora.layers import BaseLayerWithLoRA
from vllm.lora.lora_model import LoRAModel
from vllm.lora.punica_wrapper import PunicaWrapperBase
from vllm.lora.utils import (
    from_layer,
    from_layer_logits_processor,
    is_in_target_modules,
    is_supported_lora_module,
    replace_submodule,
)
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.models.utils import PPMissingLayer

logger = init_logger(__name__)


@dataclass
class LoRAModules:
    """What the surgery left in the model.

    modules: adapted module full name -> its LoRA layer (the LM head's name
        -> the LoRA logits processor).
    packed_modules: packed module full name -> its parts' full names
        (`...qkv_proj` -> `...q_proj`, `...k_proj`, `...v_proj`).
    """

    modules: dict[str, BaseLayerWithLoRA] = field(default_factory=dict)
    packed_modules: dict[str, list[str]] = field(default_factory=dict)


def match_target_modules(
    module_name: str,
    supported_lora_modules: list[str],
    lora_config: LoRAConfig,
    packed_modules_mapping: dict[str, list[str]],
) -> bool:
    """A module LoRA can adapt, and not left out by LoRAConfig.target_modules."""
    if not is_supported_lora_module(module_name, supported_lora_modules):
        return False
    return is_in_target_modules(module_name, lora_config.target_modules, packed_modules_mapping)


def packed_module_parts(
    module_full_name: str, packed_modules_mapping: dict[str, list[str]]
) -> list[str] | None:
    """The parts' full names of a packed module (None when it packs < 2)."""
    prefix, _, module_name = module_full_name.rpartition(".")
    replacements = packed_modules_mapping.get(module_name, [])
    if len(replacements) <= 1:
        return None
    return [f"{prefix}.{r}" if prefix else r for r in replacements]


def wrap_logits_processor(
    model: nn.Module,
    lm_head_name: str,
    lm_head: nn.Module,
    lora_slots: int,
    lora_config: LoRAConfig,
    model_config: Any,
) -> nn.Module:
    """Replace the logits processor next to the LM head by its LoRA layer;
    returns it, or the head itself when it cannot be adapted."""
    parent = lm_head_name.rpartition(".")[0]
    lp_name = f"{parent}.logits_processor" if parent else "logits_processor"
    logits_processor = model.get_submodule(lp_name)
    if not isinstance(lm_head, ParallelLMHead) or not isinstance(logits_processor, LogitsProcessor):
        return lm_head  # e.g. a quantized tied head: not adapted (warned by the caller)
    return replace_submodule(
        model,
        lp_name,
        from_layer_logits_processor(
            logits_processor, lm_head, lora_slots, lora_config, model_config
        ),
    )


def _refuse_or_warn_unwrapped(module_name: str, module: nn.Module, lora_config: LoRAConfig) -> None:
    """A matched module no LoRA layer wraps: refused when the deployment named
    its targets, else warned about and left unadapted."""
    message = (
        f"LoRA target module {module_name} ({type(module).__name__}) matched the "
        "deployment configuration but could not be wrapped by any LoRA layer "
        "implementation."
    )
    if lora_config.target_modules is not None:
        raise ValueError(f"{message} target_modules={sorted(lora_config.target_modules)}")
    logger.warning_once("%s It will be ignored.", message)


def create_lora_modules(
    model: nn.Module,
    supported_lora_modules: list[str],
    lora_slots: int,
    lora_config: LoRAConfig,
    packed_modules_mapping: dict[str, list[str]],
    punica_wrapper: PunicaWrapperBase,
) -> LoRAModules:
    """Swap each matched module of `model` for its LoRA layer (sharing
    `punica_wrapper`) and return what was adapted."""
    result = LoRAModules()
    wrapped_by_id: dict[int, BaseLayerWithLoRA] = {}
    model_config = getattr(model, "config", None)
    for module_name, module in list(model.named_modules(remove_duplicate=False)):
        if isinstance(module, PPMissingLayer) or not match_target_modules(
            module_name, supported_lora_modules, lora_config, packed_modules_mapping
        ):
            continue
        existing = wrapped_by_id.get(id(module))
        if existing is not None and "lm_head" not in module_name:
            replace_submodule(model, module_name, existing)
            continue
        packed = packed_modules_mapping.get(module_name.split(".")[-1], [])
        new_module = replace_submodule(
            model, module_name, from_layer(module, lora_slots, lora_config, packed, model_config)
        )
        if isinstance(new_module, BaseLayerWithLoRA):
            wrapped_by_id[id(module)] = new_module
        if "lm_head" in module_name:
            new_module = wrap_logits_processor(
                model, module_name, module, lora_slots, lora_config, model_config
            )
        if not isinstance(new_module, BaseLayerWithLoRA):
            _refuse_or_warn_unwrapped(module_name, module, lora_config)
            continue
        result.modules[module_name] = new_module
        parts = packed_module_parts(module_name, packed_modules_mapping)
        if parts is not None:
            result.packed_modules[module_name] = parts
        new_module.set_mapping(punica_wrapper)
    return result


def adapted_base_layers(
    model: nn.Module, modules: dict[str, BaseLayerWithLoRA]
) -> dict[str, nn.Module]:
    """Adapted module name -> the layer whose shapes its LoRA must have."""
    layers: dict[str, nn.Module] = {}
    for name, module in modules.items():
        # The LM head's LoRA lives in the logits processor registered under
        # the head's name; the head itself stays in the model, unwrapped.
        is_head = name.rpartition(".")[2] == "lm_head"
        layers[name] = model.get_submodule(name) if is_head else module.base_layer
    return layers


def load_into_slot(
    modules: dict[str, BaseLayerWithLoRA], index: int, lora_model: LoRAModel
) -> None:
    """Copy the adapter's A/B into slot `index` of every LoRA layer; a layer
    the adapter leaves out gets its slot zeroed (reset_lora)."""
    for module_name, module in modules.items():
        module_lora = lora_model.get_lora(module_name)
        if module_lora is None:
            module.reset_lora(index)
            continue
        assert module_lora.lora_a is not None and module_lora.lora_b is not None
        module.set_lora(index, module_lora.lora_a, module_lora.lora_b)
