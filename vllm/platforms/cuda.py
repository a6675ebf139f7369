"""The CUDA platform (upstream: vllm/platforms/cuda.py).

Only selected when `torch.cuda.is_available()`. No CUDA-specific attention
kernel exists in this tree yet, so attention uses the paged PyTorch backend,
whose tensor ops run on any device.
"""
from __future__ import annotations

import torch

from vllm.platforms.interface import Platform, PlatformEnum

TORCH_PAGED_ATTN_BACKEND = "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend"


class CudaPlatform(Platform):
    _enum = PlatformEnum.CUDA
    device_name = "cuda"
    device_type = "cuda"
    dispatch_key = "CUDA"

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return torch.cuda.get_device_name(device_id)

    @classmethod
    def get_attn_backend_cls(
        cls,
        selected_backend: str | None,
        head_size: int,
        dtype: torch.dtype,
        kv_cache_dtype: str | None,
        block_size: int,
        use_mla: bool = False,
        has_sink: bool = False,
        use_sparse: bool = False,
    ) -> str:
        if selected_backend not in (None, "CPU_ATTN"):
            raise ValueError(
                f"Attention backend {selected_backend!r} is not available; the only "
                "backend built is the paged PyTorch backend 'CPU_ATTN'.")
        if use_mla or use_sparse or has_sink:
            raise NotImplementedError("MLA, sparse and sink attention are not implemented.")
        return TORCH_PAGED_ATTN_BACKEND

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return torch.cuda.get_device_properties(device_id).total_memory

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return True
