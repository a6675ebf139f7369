"""Bodies of the runtime LoRA routes (upstream:
vllm/entrypoints/serve/lora/protocol.py). Unknown fields are ignored."""

from __future__ import annotations

from pydantic import BaseModel


class LoadLoRAAdapterRequest(BaseModel):
    lora_name: str
    lora_path: str
    # Replace the adapter already loaded under this name (else a 400).
    load_inplace: bool = False
    # MoE experts' 3D LoRA weights: refused here (no MoE LoRA).
    is_3d_lora_weight: bool = False


class UnloadLoRAAdapterRequest(BaseModel):
    lora_name: str
    # Accepted and unused, as upstream: the name identifies the adapter.
    lora_int_id: int | None = None
