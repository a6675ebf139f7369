"""Names of the attention backends and where their classes live
(upstream: vllm/attention/backends/registry.py, `AttentionBackendEnum`).

`VLLM_ATTENTION_BACKEND` takes one of these names; the platform decides
whether the named backend can run and raises `AttentionBackendUnavailableError`
(a ValueError naming the backend and the reason) when it cannot.
"""

from __future__ import annotations

import enum
import importlib.util


class AttentionBackendUnavailableError(ValueError):
    """A requested attention backend cannot run with this device / dtype /
    head size / installed packages."""

    def __init__(self, backend: str, reason: str) -> None:
        super().__init__(f"{backend} cannot run here: {reason}.")
        self.backend = backend
        self.reason = reason


class AttentionBackendEnum(enum.Enum):
    """Backend name -> qualified class name."""

    CPU_ATTN = "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend"
    TRITON_ATTN = "vllm.v1.attention.backends.triton_attn.TritonAttentionBackend"
    FLASHINFER = "vllm.v1.attention.backends.flashinfer.FlashInferBackend"

    def get_path(self) -> str:
        return self.value

    @classmethod
    def from_name(cls, name: str) -> AttentionBackendEnum:
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(
                f"Unknown attention backend {name!r}; known: {', '.join(m.name for m in cls)}."
            ) from None


def module_available(name: str) -> bool:
    """Whether `name` can be imported (without importing it)."""
    return importlib.util.find_spec(name) is not None
