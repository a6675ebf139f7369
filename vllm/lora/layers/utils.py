"""The batch -> adapter mapping handed to the Punica wrapper (upstream:
vllm/lora/layers/utils.py)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class LoRAMappingType(Enum):
    LANGUAGE = 1
    TOWER = 2
    CONNECTOR = 3


@dataclass
class LoRAMapping:
    """`index_mapping[t]`: the LoRA id (`LoRARequest.lora_int_id`, 0 = none)
    of batch token t; `prompt_mapping[s]`: the same per sampled row."""

    index_mapping: tuple[int, ...]
    prompt_mapping: tuple[int, ...]
    is_prefill: bool = False
    type: LoRAMappingType = LoRAMappingType.LANGUAGE

    def __post_init__(self) -> None:
        self.index_mapping = tuple(self.index_mapping)
        self.prompt_mapping = tuple(self.prompt_mapping)
