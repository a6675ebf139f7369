"""Pick the Punica wrapper for the current platform (upstream:
vllm/lora/punica_wrapper/punica_selector.py).

Upstream asks `current_platform.get_punica_wrapper()` for the qualified
name; our Platform classes do not have that hook yet, so the same table
(CPU -> PunicaWrapperCPU, CUDA -> PunicaWrapperGPU) is kept here.
"""

from __future__ import annotations

import importlib
from typing import Any

from vllm.logger import init_logger
from vllm.lora.punica_wrapper.punica_base import PunicaWrapperBase
from vllm.platforms import current_platform

logger = init_logger(__name__)

PUNICA_CPU = "vllm.lora.punica_wrapper.punica_cpu.PunicaWrapperCPU"
PUNICA_GPU = "vllm.lora.punica_wrapper.punica_gpu.PunicaWrapperGPU"


def punica_wrapper_qualname() -> str:
    """Qualified class name of the current platform's wrapper."""
    hook = getattr(current_platform, "get_punica_wrapper", None)
    if hook is not None:
        return str(hook())
    if current_platform.is_cuda_alike():
        return PUNICA_GPU
    if current_platform.is_cpu():
        return PUNICA_CPU
    raise NotImplementedError(f"LoRA is not supported on platform {current_platform!r}")


def get_punica_wrapper(*args: Any, **kwargs: Any) -> PunicaWrapperBase:
    """An instance of the current platform's wrapper, built with the arguments."""
    qualname = punica_wrapper_qualname()
    module_name, class_name = qualname.rsplit(".", 1)
    cls = getattr(importlib.import_module(module_name), class_name)
    wrapper = cls(*args, **kwargs)
    logger.info_once("Using %s.", class_name)
    return wrapper
