"""What the KV cache of each layer and of each worker looks like (upstream:
vllm/v1/kv_cache_interface.py, where every name below is imported from).

Each layer has a spec (`kv_cache_spec.py`: bytes per block, the most one
request needs, how layers merge; the MLA family in `kv_cache_spec_mla.py`).
Layers of one type that share a block table group as
`UniformTypeKVCacheSpecs` (`kv_cache_spec_grouping.py`), and
`KVCacheSpecRegistry` maps each spec type to its manager and grouping base
(`kv_cache_spec_registry.py`). Defined here: a
worker's KV cache layout, `KVCacheConfig` (blocks, tensors, groups), which the
engine core plans and the workers allocate. The spec family and its fields
are upstream's, so specs built by upstream code and tests mean the same here;
which kinds the KV cache manager can serve is decided in
`vllm/v1/core/single_type_kv_cache_manager.py` (the others are refused there
by name).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm.v1.kv_cache_spec import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    KVCacheSpecKind,
    KVQuantMode,
    MambaSpec,
    RSWASpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
    get_kv_quant_mode,
    get_max_in_flight_tokens,
    get_max_model_len,
    is_quantized_kv_cache,
)
from vllm.v1.kv_cache_spec_grouping import (
    UniformTypeKVCacheSpecs,
    get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window,
)
from vllm.v1.kv_cache_spec_mla import HiddenStateCacheSpec, MLAAttentionSpec, SlidingWindowMLASpec
from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry


@dataclass
class KVCacheTensor:
    """One allocation; `shared_by` lists the layers that use it. `offset` /
    `block_stride` describe a packed layout (0 = one tensor per layer)."""

    size: int  # bytes
    shared_by: list[str]
    offset: int = 0
    block_stride: int = 0


@dataclass
class KVCacheGroupSpec:
    """Layers that share one block table (same spec, same block ids)."""

    layer_names: list[str]
    kv_cache_spec: KVCacheSpec
    is_eagle_group: bool = False


@dataclass
class KVCacheConfig:
    """The KV cache of one worker: how many blocks, the tensors, the groups."""

    num_blocks: int
    kv_cache_tensors: list[KVCacheTensor]
    kv_cache_groups: list[KVCacheGroupSpec]

    @property
    def has_mamba_layers(self) -> bool:
        return any(isinstance(g.kv_cache_spec, MambaSpec) for g in self.kv_cache_groups)

    @property
    def has_mixed_precision_kv_cache(self) -> bool:
        """Whether attention groups store KV at more than one precision."""
        precisions: set[tuple[torch.dtype, KVQuantMode]] = set()
        for group in self.kv_cache_groups:
            spec = group.kv_cache_spec
            specs = getattr(spec, "kv_cache_specs", {"": spec}).values()
            precisions.update(
                (s.dtype, s.kv_quant_mode) for s in specs if isinstance(s, AttentionSpec)
            )
        return len(precisions) > 1

    @property
    def needs_kv_cache_zeroing(self) -> bool:
        """Whether new blocks must be zeroed before use: Mamba state is read
        before it is fully written, and a block reused at another precision
        would decode stale bytes as NaN / Inf."""
        return self.has_mamba_layers or self.has_mixed_precision_kv_cache


__all__ = [
    "AttentionSpec",
    "ChunkedLocalAttentionSpec",
    "CrossAttentionSpec",
    "EncoderOnlyAttentionSpec",
    "FullAttentionSpec",
    "HiddenStateCacheSpec",
    "KVCacheConfig",
    "KVCacheGroupSpec",
    "KVCacheSpec",
    "KVCacheSpecKind",
    "KVCacheSpecRegistry",
    "KVCacheTensor",
    "KVQuantMode",
    "MLAAttentionSpec",
    "MambaSpec",
    "RSWASpec",
    "SinkFullAttentionSpec",
    "SlidingWindowMLASpec",
    "SlidingWindowSpec",
    "UniformTypeKVCacheSpecs",
    "get_kv_cache_spec_kind",
    "get_kv_cache_spec_sliding_window",
    "get_kv_quant_mode",
    "get_max_in_flight_tokens",
    "get_max_model_len",
    "is_quantized_kv_cache",
]
