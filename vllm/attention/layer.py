"""Upstream v0.28's module for `Attention` (`from vllm.attention.layer import Attention`)."""

from vllm.model_executor.layers.attention import Attention

__all__ = ["Attention"]
