"""Layers of one spec type grouped under one block table
(`UniformTypeKVCacheSpecs`), and a spec's kind by name (`get_kv_cache_spec_kind`,
which KV cache events report). Imported from `vllm.v1.kv_cache_interface`,
upstream's module for them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm.utils import cdiv
from vllm.v1.kv_cache_spec import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    KVCacheSpecKind,
    MambaSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
    uniform_type_base,
)
from vllm.v1.kv_cache_spec_mla import MLAAttentionSpec, SlidingWindowMLASpec

if TYPE_CHECKING:
    from vllm.config import VllmConfig


@dataclass(frozen=True)
class UniformTypeKVCacheSpecs(KVCacheSpec):
    """The specs of several layers of one type (same token slots per request,
    possibly different page sizes), managed as one group: a block of the group
    is one page of every layer."""

    kv_cache_specs: dict[str, KVCacheSpec]

    @property
    def page_size_bytes(self) -> int:
        return sum(spec.page_size_bytes for spec in self.kv_cache_specs.values())

    def max_memory_usage_pages(self, vllm_config: VllmConfig) -> int:
        return max(
            cdiv(spec.max_memory_usage_bytes(vllm_config), spec.page_size_bytes)
            for spec in self.kv_cache_specs.values()
        )

    def max_memory_usage_bytes(self, vllm_config: VllmConfig) -> int:
        return self.max_memory_usage_pages(vllm_config) * self.page_size_bytes

    def max_num_blocks_per_req(self, vllm_config: VllmConfig, max_len: int) -> int:
        widths = {
            spec.max_num_blocks_per_req(vllm_config, max_len)
            for spec in self.kv_cache_specs.values()
        }
        assert len(widths) == 1, (
            "All layers in the same KV cache group must need the same number of block "
            f"table entries, got {sorted(widths)}."
        )
        return widths.pop()

    @classmethod
    def is_uniform_type(cls, kv_cache_specs: dict[str, KVCacheSpec]) -> bool:
        """Same block size and, per the registry, the same type."""
        if len({spec.block_size for spec in kv_cache_specs.values()}) > 1:
            return False
        first = next(iter(kv_cache_specs.values()))
        return first.is_uniform_with_collection(kv_cache_specs)

    @classmethod
    def from_specs(cls, kv_cache_specs: dict[str, KVCacheSpec]) -> UniformTypeKVCacheSpecs | None:
        if not cls.is_uniform_type(kv_cache_specs):
            return None
        block_size = next(iter(kv_cache_specs.values())).block_size
        return cls(block_size=block_size, kv_cache_specs=kv_cache_specs)

    def get_page_sizes(self) -> list[int]:
        return list({spec.page_size_bytes for spec in self.kv_cache_specs.values()})

    def get_num_layer_tuples(self) -> int:
        return Counter(spec.page_size_bytes for spec in self.kv_cache_specs.values()).most_common(
            1
        )[0][1]


# Most specific first: subclasses before the classes they extend.
_KIND_ORDER: tuple[tuple[type[KVCacheSpec], KVCacheSpecKind], ...] = (
    (SlidingWindowMLASpec, KVCacheSpecKind.SLIDING_WINDOW_MLA),
    (MLAAttentionSpec, KVCacheSpecKind.MLA_ATTENTION),
    (SinkFullAttentionSpec, KVCacheSpecKind.SINK_FULL_ATTENTION),
    (FullAttentionSpec, KVCacheSpecKind.FULL_ATTENTION),
    (ChunkedLocalAttentionSpec, KVCacheSpecKind.CHUNKED_LOCAL_ATTENTION),
    (SlidingWindowSpec, KVCacheSpecKind.SLIDING_WINDOW),
    (MambaSpec, KVCacheSpecKind.MAMBA),
    (EncoderOnlyAttentionSpec, KVCacheSpecKind.ENCODER_ONLY_ATTENTION),
    (CrossAttentionSpec, KVCacheSpecKind.CROSS_ATTENTION),
)


def get_kv_cache_spec_kind(kv_cache_spec: KVCacheSpec) -> KVCacheSpecKind:
    """The spec's kind; for a uniform group, its members' common kind (or
    FULL_ATTENTION when they all group under full attention)."""
    if isinstance(kv_cache_spec, UniformTypeKVCacheSpecs):
        specs = kv_cache_spec.kv_cache_specs.values()
        kinds = {get_kv_cache_spec_kind(spec) for spec in specs}
        if len(kinds) == 1:
            return kinds.pop()
        bases = {uniform_type_base(spec) for spec in specs}
        if bases == {FullAttentionSpec}:
            return KVCacheSpecKind.FULL_ATTENTION
        return KVCacheSpecKind.UNKNOWN
    for klass, kind in _KIND_ORDER:
        if isinstance(kv_cache_spec, klass):
            return kind
    return KVCacheSpecKind.UNKNOWN


def get_kv_cache_spec_sliding_window(kv_cache_spec: KVCacheSpec) -> int | None:
    """The window of a sliding-window spec (or of a group sharing one)."""
    if isinstance(kv_cache_spec, UniformTypeKVCacheSpecs):
        windows = {
            get_kv_cache_spec_sliding_window(spec) for spec in kv_cache_spec.kv_cache_specs.values()
        }
        return windows.pop() if len(windows) == 1 else None
    if isinstance(kv_cache_spec, SlidingWindowSpec):
        return kv_cache_spec.sliding_window
    return None
