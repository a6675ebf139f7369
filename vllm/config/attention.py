"""Attention backend choice (upstream: vllm/config/attention.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AttentionConfig:
    # An `AttentionBackendEnum` name (`--attention-backend`); None lets the
    # platform choose. The `VLLM_ATTENTION_BACKEND` variable is read only
    # when this is None. Whether the named backend can run here is the
    # platform's decision, made when the layers are built.
    backend: str | None = None

    def __post_init__(self) -> None:
        if self.backend is None:
            return
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        self.backend = AttentionBackendEnum.from_name(str(self.backend)).name
