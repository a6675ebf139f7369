"""Errors the engine front ends raise (upstream: vllm/v1/engine/exceptions.py)."""

from __future__ import annotations


class EngineGenerateError(Exception):
    """`AsyncLLM.generate()` failed for this request only; the engine still runs."""


class EngineDeadError(Exception):
    """The engine core died: every pending and future request fails with this."""

    def __init__(self, *args: object, suppress_context: bool = False, **kwargs: object) -> None:
        message = "EngineCore encountered an issue. See stack trace (above) for the root cause."
        super().__init__(message, *args, **kwargs)
        # Raised while handling a socket error: hide that (unhelpful) context.
        self.__suppress_context__ = suppress_context


class QueueOverflowError(Exception):
    """The engine's queue is full: the request was not admitted (HTTP 503 with
    Retry-After, so that clients back off instead of the queue growing)."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after
