"""Per-attention-type KV cache managers, one per KV cache group (upstream's
module): full attention here, the other attention types in the modules named
for them, and the registry entries mapping each spec type to its manager.

`get_manager_for_kv_cache_spec` builds the manager a group's spec needs. The
base class, `SingleTypeKVCacheManager`, is in
`single_type_kv_cache_manager_base.py`; every manager is importable from here,
at upstream's path.
"""

import itertools
from typing import TYPE_CHECKING, Unpack

from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.single_type_kv_cache_manager_base import (
    CacheHitSearch,
    ManagerArgs,
    SingleTypeKVCacheManager,
)
from vllm.v1.core.single_type_kv_cache_manager_chunked import ChunkedLocalAttentionManager
from vllm.v1.core.single_type_kv_cache_manager_sparse import MambaManager, SlidingWindowManager
from vllm.v1.core.single_type_kv_cache_manager_unbuilt import CrossAttentionManager, RSWAManager
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    RSWASpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)
from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

if TYPE_CHECKING:
    from vllm.config import VllmConfig

__all__ = [
    "CacheHitSearch",
    "ChunkedLocalAttentionManager",
    "CrossAttentionManager",
    "FullAttentionManager",
    "MambaManager",
    "RSWAManager",
    "SingleTypeKVCacheManager",
    "SlidingWindowManager",
    "get_manager_for_kv_cache_spec",
    "register_all_kvcache_specs",
]


class FullAttentionManager(SingleTypeKVCacheManager):
    """Full attention: every block is kept until the request finishes."""

    @classmethod
    def _find_hit(cls, search: CacheHitSearch) -> tuple[list[KVCacheBlock], ...]:
        assert isinstance(search.kv_cache_spec, FullAttentionSpec)
        computed_blocks = search.no_hit()
        # Hashes chain, so the first miss ends the hit: no later block can be
        # cached under this prefix.
        for block_hash in itertools.islice(search.block_hashes, search.max_num_blocks):
            cached_blocks = search.block_pool.get_cached_block(
                block_hash, search.kv_cache_group_ids
            )
            if cached_blocks is None:
                break
            for computed, cached in zip(computed_blocks, cached_blocks):
                computed.append(cached)
        search.drop_eagle_block(computed_blocks)
        search.align(computed_blocks)
        return computed_blocks

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        # A block is common to all requests holding blocks iff each of them
        # holds a reference to it.
        num_requests = len(self.req_to_blocks)
        num_common_blocks = 0
        for block in self.req_to_blocks[running_request_id]:
            if block.ref_cnt != num_requests:
                break
            num_common_blocks += 1
        return num_common_blocks


def register_all_kvcache_specs(vllm_config: "VllmConfig | None" = None) -> None:
    """Register the built-in spec types with their managers and grouping bases
    (upstream's names; upstream's tests pass `vllm_config`, which none of the
    built-in registrations needs)."""
    register = KVCacheSpecRegistry.register
    register(FullAttentionSpec, FullAttentionManager, FullAttentionSpec)
    register(SlidingWindowSpec, SlidingWindowManager, SlidingWindowSpec)
    register(SlidingWindowMLASpec, SlidingWindowManager, SlidingWindowMLASpec)
    register(MambaSpec, MambaManager, MambaSpec)
    register(ChunkedLocalAttentionSpec, ChunkedLocalAttentionManager, ChunkedLocalAttentionSpec)
    register(CrossAttentionSpec, CrossAttentionManager, CrossAttentionSpec)
    # Full-attention variants share full attention's groups. MLA keeps every
    # token's latent row, exactly like full attention.
    register(MLAAttentionSpec, FullAttentionManager, FullAttentionSpec)
    register(RSWASpec, RSWAManager, FullAttentionSpec)
    register(SinkFullAttentionSpec, FullAttentionManager, FullAttentionSpec)


def get_manager_for_kv_cache_spec(
    kv_cache_spec: KVCacheSpec, **kwargs: Unpack[ManagerArgs]
) -> SingleTypeKVCacheManager:
    """Build the manager registered for the spec's type (or nearest base)."""
    manager_class = KVCacheSpecRegistry.get_manager_class(kv_cache_spec)
    if manager_class is None:
        raise NotImplementedError(f"No KV cache manager for {type(kv_cache_spec).__name__}.")
    return manager_class(kv_cache_spec, **kwargs)
