"""LoRA-aware layers (upstream: vllm/lora/layers/). Only the batch mapping
record is built so far; the layers themselves are not."""

from vllm.lora.layers.utils import LoRAMapping, LoRAMappingType

__all__ = ["LoRAMapping", "LoRAMappingType"]
