"""What the engine needs to know about the device it runs on
(upstream: vllm/platforms/interface.py)."""

from __future__ import annotations

import enum
import random
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from vllm.config import VllmConfig


class PlatformEnum(enum.Enum):
    CUDA = enum.auto()
    CPU = enum.auto()
    UNSPECIFIED = enum.auto()


class Platform:
    """Base class: one subclass per device kind, used through `current_platform`."""

    _enum: PlatformEnum = PlatformEnum.UNSPECIFIED
    device_name: str = "unspecified"
    # The `torch.device` type string ("cpu", "cuda").
    device_type: str = ""
    dispatch_key: str = "CPU"
    supported_dtypes: list[torch.dtype] = [torch.bfloat16, torch.float16, torch.float32]

    def is_cuda(self) -> bool:
        return self._enum == PlatformEnum.CUDA

    def is_cpu(self) -> bool:
        return self._enum == PlatformEnum.CPU

    def is_cuda_alike(self) -> bool:
        return self.is_cuda()

    @classmethod
    def get_attn_backend_cls(
        cls,
        selected_backend: str | None,
        head_size: int,
        dtype: torch.dtype,
        kv_cache_dtype: str | None,
        block_size: int | None,
        use_mla: bool = False,
        has_sink: bool = False,
        use_sparse: bool = False,
    ) -> str:
        """Qualified name of the attention backend class for this device."""
        raise NotImplementedError(f"No attention backend for platform {cls.device_name}.")

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        """Total memory of the device in bytes."""
        raise NotImplementedError

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return cls.device_name

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        """Fill in device-dependent config values that the user left unset."""

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def inference_mode(cls):
        return torch.inference_mode(mode=True)

    @classmethod
    def seed_everything(cls, seed: int | None = None) -> None:
        """Seed python, numpy and torch RNGs (upstream semantics)."""
        if seed is not None:
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device_type={self.device_type!r})"


class UnspecifiedPlatform(Platform):
    _enum = PlatformEnum.UNSPECIFIED
    device_type = ""
