"""The CUDA platform (upstream: vllm/platforms/cuda.py).

Only selected when `torch.cuda.is_available()`. Attention defaults to the
Triton unified kernel (TRITON_ATTN) when triton is installed and the head
size is supported, else the paged PyTorch backend (CPU_ATTN, whose tensor
ops run on any device); FLASHINFER is used only when requested and installed.
"""
from __future__ import annotations

import torch

from vllm.platforms.interface import Platform, PlatformEnum

TORCH_PAGED_ATTN_BACKEND = "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend"
_TRITON_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)


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
        from vllm.v1.attention.backends.registry import (AttentionBackendEnum,
                                                         module_available)
        if use_mla or use_sparse or has_sink:
            raise NotImplementedError("MLA, sparse and sink attention are not implemented.")
        triton_ok = module_available("triton") and dtype in (
            torch.float16, torch.bfloat16, torch.float32)
        if selected_backend is None:
            # Upstream's order, restricted to what this tree builds: the
            # Triton unified kernel, else the paged PyTorch backend.
            if triton_ok and head_size in _TRITON_HEAD_SIZES:
                return AttentionBackendEnum.TRITON_ATTN.get_path()
            return TORCH_PAGED_ATTN_BACKEND
        backend = AttentionBackendEnum.from_name(selected_backend)
        if backend == AttentionBackendEnum.TRITON_ATTN and not triton_ok:
            raise ValueError(f"TRITON_ATTN cannot run here: needs triton and fp16/bf16/fp32 "
                             f"(got dtype {dtype}, triton installed: "
                             f"{module_available('triton')}).")
        if backend == AttentionBackendEnum.FLASHINFER:
            raise ValueError("FLASHINFER is not built in this tree (it is optional); "
                             "use TRITON_ATTN or CPU_ATTN.")
        return backend.get_path()

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return torch.cuda.get_device_properties(device_id).total_memory

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return True
