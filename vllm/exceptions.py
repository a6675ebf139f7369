"""Typed errors that the front ends map to HTTP status codes (upstream:
vllm/exceptions.py).

`VLLMClientError` subclasses are caused by the request (4xx),
`VLLMServerError` ones by the server (5xx). `VLLMValidationError` also stays
a `ValueError`, which the callers here have always caught.
"""

from __future__ import annotations

from typing import Any


class VLLMError(Exception):
    """Base class of vLLM's own errors."""


class VLLMClientError(VLLMError):
    """Caused by the client's request (HTTP 4xx)."""


class VLLMServerError(VLLMError):
    """Caused by the server (HTTP 5xx)."""


class VLLMValidationError(VLLMClientError, ValueError):
    """Bad user input (HTTP 400). Carries the offending parameter and value."""

    def __init__(self, message: str, *, parameter: str | None = None, value: Any = None):
        super().__init__(message)
        self.parameter = parameter
        self.value = value


class VLLMNotFoundError(VLLMClientError):
    """Something the request names does not exist (HTTP 404)."""


class LoRAAdapterNotFoundError(VLLMNotFoundError):
    """No adapter at the path a LoRARequest names (no directory, or no
    `adapter_config.json` in it)."""

    message: str

    def __init__(self, lora_name: str, lora_path: str) -> None:
        self.lora_name = lora_name
        self.lora_path = lora_path
        self.message = f"Loading lora {lora_name} failed: No adapter found for {lora_path}"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        # Rebuilt from its two fields when it crosses a process boundary.
        return (self.__class__, (self.lora_name, self.lora_path))
