"""Typed errors that the front ends map to HTTP status codes."""

from __future__ import annotations

from typing import Any


class VLLMValidationError(ValueError):
    """Bad user input (HTTP 400). Carries the offending parameter and value."""

    def __init__(self, message: str, *, parameter: str | None = None, value: Any = None):
        super().__init__(message)
        self.parameter = parameter
        self.value = value
