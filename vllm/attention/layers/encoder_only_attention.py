"""Bidirectional attention without a KV cache, for encoder-only models such as
BERT (upstream: vllm/attention/layers/encoder_only_attention.py).

An `EncoderOnlyAttention` layer attends over its own request's tokens of the
step, every query seeing every key (non-causal). It keeps nothing between
steps, so:
- `get_kv_cache_spec` returns None: the scheduler's KV cache config has no
  group for it and no block is ever allocated for it;
- the model runner appends a cache-less `EncoderOnlyAttentionSpec` group for
  these layers to its own copy of the config
  (`vllm/v1/worker/kv_cache_setup.py:add_encoder_only_layers_to_kv_cache_config`),
  only so that their metadata builder is created and run each step;
- the whole prompt must be in one step: the engine turns chunked prefill and
  prefix caching off for pooling models, and the backends refuse a step where
  a request has tokens computed earlier.

The layer uses the platform's backend with its metadata builder wrapped so the
common metadata it builds from says `causal=False`; the backend's impl sees
`attn_type == AttentionType.ENCODER_ONLY` and skips the cache.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

from vllm.model_executor.layers.attention import Attention
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)

if TYPE_CHECKING:
    from vllm.config import CacheConfig, VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheSpec


@functools.cache
def create_encoder_only_attention_backend(
    underlying_attn_backend: type[AttentionBackend],
) -> type[AttentionBackend]:
    """A subclass of `underlying_attn_backend` whose metadata builder builds
    from the step's common metadata with `causal=False` (one class per
    underlying backend, so layers sharing a backend share one builder)."""
    underlying_builder: type[AttentionMetadataBuilder[Any]] = (
        underlying_attn_backend.get_builder_cls()
    )

    class EncoderOnlyAttentionBuilder(underlying_builder):  # type: ignore[valid-type,misc]
        def build(
            self,
            common_prefix_len: int,
            common_attn_metadata: CommonAttentionMetadata,
            fast_build: bool = False,
        ) -> Any:
            non_causal = dataclasses.replace(common_attn_metadata, causal=False)
            return super().build(common_prefix_len, non_causal, fast_build)

    def get_builder_cls() -> type[AttentionMetadataBuilder[Any]]:
        return EncoderOnlyAttentionBuilder

    name = f"EncoderOnlyAttention_{underlying_attn_backend.__name__}"
    return type(
        name, (underlying_attn_backend,), {"get_builder_cls": staticmethod(get_builder_cls)}
    )


class EncoderOnlyAttention(Attention):
    """Non-causal self-attention over a request's own tokens; no KV cache."""

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        cache_config: CacheConfig | None = None,
        attn_type: str | None = None,
        **kwargs: Any,
    ) -> None:
        if attn_type is not None and attn_type != AttentionType.ENCODER_ONLY:
            raise ValueError(
                f"EncoderOnlyAttention only supports AttentionType.ENCODER_ONLY, got {attn_type!r}."
            )
        super().__init__(
            num_heads,
            head_size,
            scale,
            cache_config=cache_config,
            attn_type=AttentionType.ENCODER_ONLY,
            **kwargs,
        )
        # Same impl class; only the builder differs (it marks the step non-causal).
        self.attn_backend = create_encoder_only_attention_backend(self.attn_backend)

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> KVCacheSpec | None:  # type: ignore[override]
        return None  # nothing is cached between steps
