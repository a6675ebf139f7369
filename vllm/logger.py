"""Logging for vLLM (upstream: vllm/logger.py)."""

from __future__ import annotations

import logging
import os
import sys
from functools import cache

_FORMAT = "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"
_DATE_FORMAT = "%m-%d %H:%M:%S"
_root = logging.getLogger("vllm")


def _configure_root() -> None:
    if _root.handlers:
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(_FORMAT, datefmt=_DATE_FORMAT))
    _root.addHandler(handler)
    _root.setLevel(os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper())
    _root.propagate = False


@cache
def _log_once(logger: logging.Logger, level: int, msg: str, *args) -> None:
    logger.log(level, msg, *args, stacklevel=3)


class _VllmLogger(logging.Logger):
    def info_once(self, msg: str, *args) -> None:
        _log_once(self, logging.INFO, msg, *args)

    def warning_once(self, msg: str, *args) -> None:
        _log_once(self, logging.WARNING, msg, *args)

    def debug_once(self, msg: str, *args) -> None:
        _log_once(self, logging.DEBUG, msg, *args)


def init_logger(name: str) -> _VllmLogger:
    """A logger under the `vllm` root with `info_once` / `warning_once`."""
    _configure_root()
    logger = logging.getLogger(name)
    logger.__class__ = _VllmLogger
    return logger  # type: ignore[return-value]
