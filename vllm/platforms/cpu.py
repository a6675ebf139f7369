"""The CPU platform (upstream: vllm/platforms/cpu.py)."""

from __future__ import annotations

import psutil
import torch

from vllm.platforms.interface import Platform, PlatformEnum

CPU_ATTN_BACKEND = "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend"


class CpuPlatform(Platform):
    _enum = PlatformEnum.CPU
    device_name = "cpu"
    device_type = "cpu"
    dispatch_key = "CPU"

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return "cpu"

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
        if selected_backend is not None and selected_backend.upper() != "CPU_ATTN":
            from vllm.v1.attention.backends.registry import (
                AttentionBackendEnum,
                AttentionBackendUnavailableError,
            )

            backend = AttentionBackendEnum.from_name(selected_backend)  # unknown -> ValueError
            raise AttentionBackendUnavailableError(
                backend.name,
                "it needs a GPU and cannot run on CPU; the only CPU backend is CPU_ATTN",
            )
        if use_mla or use_sparse or has_sink:
            raise NotImplementedError("MLA, sparse and sink attention are not implemented on CPU.")
        return CPU_ATTN_BACKEND

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return psutil.virtual_memory().total

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False
