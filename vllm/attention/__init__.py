"""Upstream v0.28's import path for the attention layer and its types."""

from vllm.model_executor.layers.attention import Attention
from vllm.v1.attention.backend import AttentionBackend, AttentionType

__all__ = ["Attention", "AttentionBackend", "AttentionType"]
