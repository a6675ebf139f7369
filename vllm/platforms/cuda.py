"""The CUDA platform (upstream: vllm/platforms/cuda.py).

Only selected when `torch.cuda.is_available()`. Attention defaults to the
Triton unified kernel (TRITON_ATTN) when triton is installed and the head
size is supported, else the paged PyTorch backend (CPU_ATTN, whose tensor
ops run on any device); FLASHINFER (vllm/v1/attention/backends/flashinfer.py)
is used only when requested (VLLM_ATTENTION_BACKEND=FLASHINFER) and the
optional `flashinfer` package is installed.
"""

from __future__ import annotations

import torch

from vllm.platforms.interface import Platform, PlatformEnum

TORCH_PAGED_ATTN_BACKEND = "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend"
_TRITON_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)


def _flashinfer_unusable_reason(
    head_size: int, dtype: torch.dtype, kv_cache_dtype: str | None
) -> str | None:
    """Why FLASHINFER cannot serve these layers (None when it can). Only the
    requirements are checked here; `flashinfer` itself is imported on first use."""
    from vllm.v1.attention.backends.flashinfer import FlashInferBackend
    from vllm.v1.attention.backends.registry import module_available

    if not module_available("flashinfer"):
        return "the optional package flashinfer is not installed (pip install flashinfer-python)"
    if not FlashInferBackend.supports_dtype(dtype):
        return f"it supports float16 / bfloat16 only (got {dtype})"
    if not FlashInferBackend.supports_head_size(head_size):
        return f"head size {head_size} is not one of {FlashInferBackend.get_supported_head_sizes()}"
    if kv_cache_dtype not in (None, "auto"):
        return f"kv_cache_dtype {kv_cache_dtype!r} is not built (use 'auto')"
    return None


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
        block_size: int | None,
        use_mla: bool = False,
        has_sink: bool = False,
        use_sparse: bool = False,
    ) -> str:
        from vllm.v1.attention.backends.registry import (
            AttentionBackendEnum,
            AttentionBackendUnavailableError,
            module_available,
        )

        if use_mla or use_sparse or has_sink:
            raise NotImplementedError("MLA, sparse and sink attention are not implemented.")
        triton_ok = module_available("triton") and dtype in (
            torch.float16,
            torch.bfloat16,
            torch.float32,
        )
        if selected_backend is None:
            # Upstream's order, restricted to what this tree builds: the
            # Triton unified kernel, else the paged PyTorch backend.
            if triton_ok and head_size in _TRITON_HEAD_SIZES:
                return AttentionBackendEnum.TRITON_ATTN.get_path()
            return TORCH_PAGED_ATTN_BACKEND
        backend = AttentionBackendEnum.from_name(selected_backend)
        if backend == AttentionBackendEnum.TRITON_ATTN and not triton_ok:
            raise AttentionBackendUnavailableError(
                "TRITON_ATTN",
                f"needs triton and fp16/bf16/fp32 (got dtype {dtype}, "
                f"triton installed: {module_available('triton')})",
            )
        if backend == AttentionBackendEnum.FLASHINFER:
            reason = _flashinfer_unusable_reason(head_size, dtype, kv_cache_dtype)
            if reason is not None:
                raise AttentionBackendUnavailableError("FLASHINFER", reason)
        return backend.get_path()

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return torch.cuda.get_device_properties(device_id).total_memory

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return True
