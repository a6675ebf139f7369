"""A peft LoRA adapter's configuration (upstream: vllm/lora/peft_helper.py).

Reads `adapter_config.json` as peft's `LoraConfig.save_pretrained` writes
it: `r` (rank), `lora_alpha`, `target_modules` (a list of module-name
suffixes, or one regex string), `bias`, `modules_to_save`, `use_rslora`,
`use_dora`, and ignores the keys vLLM does not use (`peft_type`,
`base_model_name_or_path`, `lora_dropout`, ...).

The scaling applied to an adapter's output, `scaling * B @ A @ x`, is
`lora_alpha / r`, or `lora_alpha / sqrt(r)` with rsLoRA, as peft computes it.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import MISSING, dataclass, field, fields
from typing import Literal

from vllm.config.lora import LoRAConfig
from vllm.logger import init_logger

logger = init_logger(__name__)


@dataclass
class PEFTHelper:
    """A peft LoRA configuration, checked against what vLLM supports."""

    # Required fields
    r: int
    lora_alpha: int
    target_modules: list[str] | str

    bias: Literal["none"] = field(default="none")
    modules_to_save: list[str] | None = field(default=None)
    # Rank-Stabilized LoRA (https://arxiv.org/abs/2312.03732): scale by
    # alpha / sqrt(r) instead of alpha / r.
    use_rslora: bool = field(default=False)
    # Weight-Decomposed Low-Rank Adaptation (https://arxiv.org/abs/2402.09353).
    use_dora: bool = field(default=False)
    # vLLM's own fields start with `vllm_` so they cannot clash with peft's.
    vllm_lora_scaling_factor: float = field(default=1.0)
    vllm_max_position_embeddings: int | None = field(default=None)

    def _validate_features(self) -> list[str]:
        """Messages for the LoRA features vLLM does not support."""
        error_msg = []
        if self.modules_to_save:
            error_msg.append("vLLM only supports modules_to_save being None.")
        if self.use_dora:
            error_msg.append("vLLM does not yet support DoRA.")
        return error_msg

    def __post_init__(self) -> None:
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r <= 0:
            raise ValueError(f"LoRA rank `r` must be a positive integer, got {self.r}.")
        if self.use_rslora:
            logger.info_once("Loading LoRA weights trained with rsLoRA.")
            self.vllm_lora_scaling_factor = self.lora_alpha / math.sqrt(self.r)
        else:
            self.vllm_lora_scaling_factor = self.lora_alpha / self.r

    @classmethod
    def from_dict(cls, config_dict: dict) -> PEFTHelper:
        """Build from an adapter_config.json's dict; keys that are not fields
        are dropped, a missing required field is refused."""
        class_fields = {f.name: f for f in fields(cls)}
        required_fields = {
            name
            for name, f in class_fields.items()
            if f.default is MISSING and f.default_factory is MISSING
        }
        missing_fields = required_fields - set(config_dict.keys())
        if missing_fields:
            raise ValueError(f"Missing required configuration fields: {missing_fields}")
        filtered_dict = {k: v for k, v in config_dict.items() if k in class_fields}
        return cls(**filtered_dict)

    @classmethod
    def from_local_dir(
        cls,
        lora_path: str,
        max_position_embeddings: int | None,
        tensorizer_config_dict: dict | None = None,
    ) -> PEFTHelper:
        """Read `<lora_path>/adapter_config.json`. A missing directory or file
        raises FileNotFoundError (the worker reports it as adapter not found)."""
        if tensorizer_config_dict:
            raise ValueError(
                "tensorizer_config_dict: loading LoRA adapters with tensorizer is not built."
            )
        lora_config_path = os.path.join(lora_path, "adapter_config.json")
        with open(lora_config_path) as f:
            config = json.load(f)
        if not isinstance(config, dict):
            raise ValueError(f"{lora_config_path} must hold a JSON object.")
        config["vllm_max_position_embeddings"] = max_position_embeddings
        return cls.from_dict(config)

    def validate_legal(self, lora_config: LoRAConfig) -> None:
        """Refuse (ValueError, all reasons in one message) an adapter this
        engine cannot serve under `lora_config`."""
        error_msg = self._validate_features()
        if self.r > lora_config.max_lora_rank:
            error_msg.append(
                f"LoRA rank {self.r} is greater than max_lora_rank {lora_config.max_lora_rank}."
            )
        if self.bias != "none":
            error_msg.append("Adapter bias is not supported.")
        if error_msg:
            raise ValueError(f"{' '.join(error_msg)}")
