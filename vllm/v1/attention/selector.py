"""Choose the attention backend for a layer (upstream: vllm/v1/attention/selector.py)."""

from __future__ import annotations

import importlib
from functools import cache

import torch

from vllm import envs
from vllm.v1.attention.backend import AttentionBackend


def _resolve_qualname(qualname: str) -> type[AttentionBackend]:
    module_name, _, cls_name = qualname.rpartition(".")
    return getattr(importlib.import_module(module_name), cls_name)


def get_attn_backend(
    head_size: int,
    dtype: torch.dtype,
    kv_cache_dtype: str | None,
    block_size: int | None,
    use_mla: bool = False,
    has_sink: bool = False,
    use_sparse: bool = False,
) -> type[AttentionBackend]:
    """The backend class for these layer properties on the current platform.

    The current config's `attention_config.backend` (`--attention-backend`),
    else `VLLM_ATTENTION_BACKEND`, overrides the platform default; the
    platform raises if it cannot serve the requested one.
    """
    return _cached_get_attn_backend(
        head_size,
        dtype,
        kv_cache_dtype,
        block_size,
        use_mla,
        has_sink,
        use_sparse,
        _requested_backend(),
    )


def _requested_backend() -> str | None:
    from vllm.config.vllm import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    if config is not None and config.attention_config.backend is not None:
        return config.attention_config.backend
    return envs.VLLM_ATTENTION_BACKEND


@cache
def _cached_get_attn_backend(
    head_size: int,
    dtype: torch.dtype,
    kv_cache_dtype: str | None,
    block_size: int | None,
    use_mla: bool,
    has_sink: bool,
    use_sparse: bool,
    selected_backend: str | None,
) -> type[AttentionBackend]:
    from vllm.platforms import current_platform

    qualname = current_platform.get_attn_backend_cls(
        selected_backend,
        head_size,
        dtype,
        kv_cache_dtype,
        block_size,
        use_mla=use_mla,
        has_sink=has_sink,
        use_sparse=use_sparse,
    )
    backend = _resolve_qualname(qualname)
    if not backend.supports_head_size(head_size):
        raise ValueError(
            f"Head size {head_size} is not supported by {backend.get_name()}; "
            f"supported: {backend.get_supported_head_sizes()}."
        )
    return backend
