"""Per-platform drivers of the multi-LoRA ops (upstream:
vllm/lora/punica_wrapper/)."""

from vllm.lora.punica_wrapper.punica_base import PunicaWrapperBase
from vllm.lora.punica_wrapper.punica_selector import get_punica_wrapper

__all__ = ["PunicaWrapperBase", "get_punica_wrapper"]
