"""Phi-3 for causal LM (upstream: vllm/model_executor/models/phi3.py).

Llama's decoder; the checkpoint already stores q/k/v fused as `qkv_proj` and
gate/up fused as `gate_up_proj`, so those tensors load whole into the fused
layers (no shard mapping), and rotary may cover only part of each head
(`partial_rotary_factor`).
"""
from __future__ import annotations

from typing import ClassVar

from vllm.model_executor.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {
        "qkv_proj": ["qkv_proj"],
        "gate_up_proj": ["gate_up_proj"],
    }
