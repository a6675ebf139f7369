"""Executors: how the engine core reaches its workers (upstream: vllm/v1/executor/)."""

from vllm.v1.executor.abstract import Executor

__all__ = ["Executor"]
