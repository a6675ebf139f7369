"""A loaded LoRA adapter (upstream: vllm/lora/lora_model.py).

`LoRAModel.from_local_checkpoint` reads a peft adapter directory:
`adapter_model.safetensors` (else `adapter_model.bin` / `.pt`, a pickled
state dict read with weights_only=True). Every tensor name must be a LoRA
A/B of a module whose last name part is in `expected_lora_modules`
(the model's supported modules with packed ones unpacked: `qkv_proj` ->
`q_proj`, `k_proj`, `v_proj`); otherwise the whole adapter is refused, naming
the modules, before any tensor is read. The MoE expert layouts and
tensorizer-serialized adapters of upstream are not built.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import safetensors
import torch

from vllm.logger import init_logger
from vllm.lora.lora_weights import LoRALayerWeights
from vllm.lora.peft_helper import PEFTHelper
from vllm.lora.utils import (
    WeightNameMapper,
    get_lora_id,
    is_base_embedding_weights,
    parse_fine_tuned_lora_name,
)
from vllm.utils import is_pin_memory_available

logger = init_logger(__name__)


class LoRAModel:
    """A LoRA fine-tuned model: module name -> that module's LoRA weights."""

    def __init__(
        self,
        lora_model_id: int,
        rank: int,
        loras: dict[str, LoRALayerWeights],
        is_3d_lora_weight: bool = False,
    ) -> None:
        if lora_model_id <= 0:
            raise ValueError(f"a valid lora id should be greater than 0, got {lora_model_id}")
        self.id = lora_model_id
        self.rank = rank
        self.loras: dict[str, LoRALayerWeights] = loras
        # Upstream: the on-disk MoE layout; MoE LoRA is not built.
        self.is_3d_lora_weight = is_3d_lora_weight

    def clone(self, lora_model_id: int) -> LoRAModel:
        """A copy with another id, sharing the tensors."""
        return self.__class__(
            lora_model_id,
            rank=self.rank,
            loras=self.loras.copy(),
            is_3d_lora_weight=self.is_3d_lora_weight,
        )

    def get_lora(self, module_name: str) -> LoRALayerWeights | None:
        """The LoRA of a module by its full name, None when not adapted."""
        return self.loras.get(module_name, None)

    def check_lora_name(self, lora_name: str) -> bool:
        return lora_name in self.loras

    @staticmethod
    def _should_skip_module(module_name: str, skip_prefixes: list[str]) -> bool:
        """Whether a model-defined prefix (e.g. "mtp.") marks the module as unused."""
        return any(f".{p}" in module_name or module_name.startswith(p) for p in skip_prefixes)

    @classmethod
    def from_lora_tensors(
        cls,
        lora_model_id: int,
        tensors: dict[str, torch.Tensor],
        peft_helper: PEFTHelper,
        device: str = "cuda",
        dtype: torch.dtype | None = None,
        model_vocab_size: int | None = None,
        weights_mapper: WeightNameMapper | None = None,
        skip_prefixes: list[str] | None = None,
    ) -> LoRAModel:
        """Build from a peft state dict (tensor name -> tensor), casting to
        `dtype` on `device`; the scaling is the adapter's (rsLoRA included),
        not yet folded into lora_b."""
        pin_memory = str(device) == "cpu" and is_pin_memory_available()
        loras: dict[str, LoRALayerWeights] = {}
        for tensor_name, tensor in tensors.items():
            if is_base_embedding_weights(tensor_name):
                continue
            if skip_prefixes and cls._should_skip_module(tensor_name, skip_prefixes):
                continue
            module_name, is_lora_a = parse_fine_tuned_lora_name(tensor_name, weights_mapper)
            if module_name not in loras:
                loras[module_name] = LoRALayerWeights.from_config(module_name, peft_helper)
            if (
                is_lora_a
                and "lora_embedding_A" in tensor_name
                and model_vocab_size is not None
                and model_vocab_size != tensor.shape[1]
            ):
                raise RuntimeError(
                    f"The embedding LoRA size({tensor.shape[1]}) must be consistent"
                    f" with the base model's vocabulary size({model_vocab_size})."
                )
            value = tensor.to(device=device, dtype=dtype)
            if pin_memory:
                value = value.pin_memory()
            if is_lora_a:
                loras[module_name].lora_a = value
            else:
                loras[module_name].lora_b = value
        _check_pairs(loras, peft_helper.r)
        return cls(lora_model_id, peft_helper.r, loras)

    @classmethod
    def from_local_checkpoint(
        cls,
        lora_dir: str,
        expected_lora_modules: set[str],
        peft_helper: PEFTHelper,
        *,
        lora_model_id: int | None = None,
        device: str = "cuda",
        dtype: torch.dtype | None = None,
        model_vocab_size: int | None = None,
        weights_mapper: WeightNameMapper | None = None,
        tensorizer_config_dict: dict | None = None,
        skip_prefixes: list[str] | None = None,
    ) -> LoRAModel:
        """Load a peft adapter directory (see the module docstring).

        `lora_model_id` None takes a fresh id from a global counter. A
        directory with no adapter tensors file, tensors of unexpected modules,
        or `modules_to_save` raise ValueError naming what is wrong.
        """
        if tensorizer_config_dict:
            raise ValueError(
                "tensorizer_config_dict: loading LoRA adapters with tensorizer is not built."
            )
        if peft_helper.modules_to_save:
            raise ValueError("vLLM only supports modules_to_save being None.")
        safetensors_path = os.path.join(lora_dir, "adapter_model.safetensors")
        pickled_paths = [
            os.path.join(lora_dir, "adapter_model.bin"),
            os.path.join(lora_dir, "adapter_model.pt"),
        ]
        tensors: dict[str, torch.Tensor] = {}
        if os.path.isfile(safetensors_path):
            # The safetensors keys are the source of truth: peft drops a
            # target_modules entry the model lacks, so the config's list may
            # name modules that have no tensors.
            with safetensors.safe_open(safetensors_path, framework="pt") as f:  # type: ignore[no-untyped-call]
                _check_unexpected_modules(
                    f.keys(), lora_dir, expected_lora_modules, weights_mapper, skip_prefixes
                )
                tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
        elif any(os.path.isfile(p) for p in pickled_paths):
            path = next(p for p in pickled_paths if os.path.isfile(p))
            tensors = torch.load(path, map_location="cpu", weights_only=True)
            _check_unexpected_modules(
                tensors.keys(), lora_dir, expected_lora_modules, weights_mapper, skip_prefixes
            )
        else:
            raise ValueError(f"{lora_dir} doesn't contain tensors")

        return cls.from_lora_tensors(
            lora_model_id=get_lora_id() if lora_model_id is None else lora_model_id,
            tensors=tensors,
            peft_helper=peft_helper,
            device=device,
            dtype=dtype,
            model_vocab_size=model_vocab_size,
            weights_mapper=weights_mapper,
            skip_prefixes=skip_prefixes,
        )


def _check_unexpected_modules(
    names: Iterable[str],
    lora_dir: str,
    expected_lora_modules: set[str],
    weights_mapper: WeightNameMapper | None,
    skip_prefixes: list[str] | None,
) -> None:
    """Refuse an adapter that targets a module the model cannot adapt,
    naming every such module once (upstream's message)."""
    unexpected_modules: list[str] = []
    for name in names:
        if is_base_embedding_weights(name) or "base_layer" in name:
            continue
        if skip_prefixes and LoRAModel._should_skip_module(name, skip_prefixes):
            continue
        module_name, _ = parse_fine_tuned_lora_name(name, weights_mapper)
        suffix = module_name.rsplit(".", 1)[-1]
        # Once per module (upstream lists it for A and for B).
        if suffix not in expected_lora_modules and module_name not in unexpected_modules:
            unexpected_modules.append(module_name)
    if unexpected_modules:
        raise ValueError(
            f"While loading {lora_dir}, expected"
            f" target modules in {expected_lora_modules}"
            f" but received {unexpected_modules}."
            f" Please verify that the loaded LoRA module is correct"
        )


def _check_pairs(loras: dict[str, LoRALayerWeights], rank: int) -> None:
    """Each module needs both A and B, of the adapter's rank: a truncated
    or foreign checkpoint is refused here rather than failing mid-forward."""
    for name, lora in loras.items():
        if lora.lora_a is None or lora.lora_b is None:
            missing = "lora_A" if lora.lora_a is None else "lora_B"
            raise ValueError(f"LoRA module {name} has no {missing} tensor.")
        if lora.lora_a.dim() != 2 or lora.lora_b.dim() != 2:
            raise ValueError(f"LoRA module {name}: lora_A and lora_B must be 2-D.")
        if lora.lora_a.shape[0] != rank or lora.lora_b.shape[1] != rank:
            raise ValueError(
                f"LoRA module {name}: lora_A {tuple(lora.lora_a.shape)} and lora_B "
                f"{tuple(lora.lora_b.shape)} do not match the adapter's rank r={rank}."
            )
