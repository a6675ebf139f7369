"""Triton multi-LoRA kernels (upstream: vllm/lora/ops/triton_ops/): shrink and
expand over tokens grouped by adapter slot, with their metadata."""

from vllm.lora.ops.triton_ops.lora_expand_op import lora_expand
from vllm.lora.ops.triton_ops.lora_kernel_metadata import LoRAKernelMeta
from vllm.lora.ops.triton_ops.lora_shrink_op import lora_shrink

__all__ = ["LoRAKernelMeta", "lora_expand", "lora_shrink"]
