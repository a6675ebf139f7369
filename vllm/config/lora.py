"""LoRA configuration (upstream: vllm/config/lora.py).

`EngineArgs` builds it from `--enable-lora` and the LoRA flags
(`VllmConfig.lora_config`, None without `--enable-lora`); `VllmConfig`
resolves `lora_dtype` against the model (`verify_with_model_config`).

Fields for features that are not built (multimodal default adapters, the
vision tower's LoRA, MoE adapter layouts) are accepted only at their default
values; any other value is refused naming the field.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

import torch

if TYPE_CHECKING:
    from vllm.config.model import ModelConfig

LoRADType = Literal["auto", "float16", "bfloat16"]
MaxLoRARanks = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
LoRAExtraVocabSize = Literal[256, 512]

_LORA_DTYPES: dict[str, torch.dtype] = {"float16": torch.float16, "bfloat16": torch.bfloat16}
# Field name -> its default; a different value names a feature not built.
_NOT_BUILT: dict[str, tuple[Any, str]] = {
    "default_mm_loras": (None, "multimodal inputs are not built"),
    "enable_tower_connector_lora": (False, "multimodal models are not built"),
    "enable_mixed_moe_lora_format": (False, "MoE LoRA is not built"),
    "enable_moe_shared_loras": (False, "MoE LoRA is not built"),
}


@dataclass
class LoRAConfig:
    """Configuration for LoRA."""

    # Max LoRA rank: an adapter with a larger `r` is refused on load.
    max_lora_rank: MaxLoRARanks = 16
    # Max number of LoRAs in a single batch.
    max_loras: int = 1
    # By default only half of the LoRA computation is sharded with tensor
    # parallelism; True uses the fully sharded layers.
    fully_sharded_loras: bool = False
    # Maximum number of LoRAs kept in CPU memory; must be >= max_loras
    # (None: max_loras).
    max_cpu_loras: int | None = None
    # Data type of the adapter weights; "auto": the base model's dtype
    # (resolved by verify_with_model_config).
    lora_dtype: torch.dtype | LoRADType = "auto"
    # Restrict LoRA to these module suffixes (e.g. ["o_proj", "qkv_proj"]);
    # None: every module the model supports.
    target_modules: list[str] | None = None
    # Upstream: modality -> adapter path for multimodal models. Not built.
    default_mm_loras: dict[str, str] | None = None
    # Upstream: LoRA on a multimodal model's vision tower and connector. Not built.
    enable_tower_connector_lora: bool = False
    # Capture CUDA graphs per count of active adapters (powers of 2 up to
    # max_loras); only takes effect where CUDA graphs are specialized for LoRA.
    specialize_active_lora: bool = False
    # Upstream: MoE adapter layouts. Not built.
    enable_mixed_moe_lora_format: bool = False
    enable_moe_shared_loras: bool = False

    def __post_init__(self) -> None:
        if self.max_lora_rank not in get_args(MaxLoRARanks):
            raise ValueError(
                f"max_lora_rank ({self.max_lora_rank}) must be one of "
                f"{list(get_args(MaxLoRARanks))}."
            )
        if isinstance(self.max_loras, bool) or self.max_loras < 1:
            raise ValueError(f"max_loras ({self.max_loras}) must be >= 1.")
        if self.max_cpu_loras is None:
            self.max_cpu_loras = self.max_loras
        elif self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})."
            )
        if not isinstance(self.lora_dtype, torch.dtype) and self.lora_dtype not in get_args(
            LoRADType
        ):
            raise ValueError(
                f"lora_dtype ({self.lora_dtype!r}) must be a torch.dtype or one of "
                f"{list(get_args(LoRADType))}."
            )
        if self.target_modules is not None and (
            isinstance(self.target_modules, str)
            or not all(isinstance(m, str) and m for m in self.target_modules)
        ):
            raise ValueError(
                "target_modules must be a list of module-name suffixes, "
                f"got {self.target_modules!r}."
            )
        for name, (default, why) in _NOT_BUILT.items():
            if getattr(self, name) != default:
                raise ValueError(f"LoRAConfig.{name}: {why}; leave it at {default!r}.")

    def compute_hash(self) -> str:
        """A hash of the fields that change the computation graph (upstream's
        factors, same order)."""
        factors: list[Any] = [
            self.max_lora_rank,
            self.max_loras,
            self.fully_sharded_loras,
            self.lora_dtype,
            self.enable_tower_connector_lora,
            self.enable_mixed_moe_lora_format,
            self.enable_moe_shared_loras,
            tuple(sorted(self.target_modules)) if self.target_modules else None,
        ]
        return hashlib.sha256(str(factors).encode()).hexdigest()

    def verify_with_model_config(self, model_config: ModelConfig) -> None:
        """Resolve lora_dtype: "auto" -> the model's dtype, a name -> torch dtype."""
        if self.lora_dtype in (None, "auto"):
            dtype = model_config.dtype  # a torch.dtype once ModelConfig resolved it
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"The model's dtype {dtype!r} is not resolved.")
            self.lora_dtype = dtype
        elif isinstance(self.lora_dtype, str):
            self.lora_dtype = _LORA_DTYPES[self.lora_dtype]
