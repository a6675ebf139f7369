"""The LoRA adapter named by a request (upstream: vllm/lora/request.py).

Constructing one is fine (the KV cache keys prefix-cache blocks by adapter
name, and upstream's tests build requests with one); asking the engine to run
with it is refused in `InputProcessor`, since LoRA is not built.
"""

from __future__ import annotations

import msgspec


class LoRARequest(
    msgspec.Struct,
    omit_defaults=True,  # type: ignore[call-arg]
    array_like=True,  # type: ignore[call-arg]
):
    """A LoRA adapter: `lora_int_id` must be > 0 and unique per adapter;
    two requests are the same adapter when their `lora_name`s are equal."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None
    tensorizer_config_dict: dict | None = None
    load_inplace: bool = False
    is_3d_lora_weight: bool = False

    def __post_init__(self) -> None:
        if self.lora_int_id < 1:
            raise ValueError(f"id must be > 0, got {self.lora_int_id}")
        if not self.lora_path:
            raise ValueError("lora_path cannot be empty")

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path

    def __eq__(self, other: object) -> bool:
        return isinstance(other, self.__class__) and self.lora_name == other.lora_name

    def __hash__(self) -> int:
        return hash(self.lora_name)
