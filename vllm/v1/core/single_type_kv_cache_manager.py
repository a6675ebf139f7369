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


# The manager of each built-in spec type; its grouping base is the type's own
# (KVCacheSpec.default_uniform_type_base). Full-attention variants share full
# attention's groups and manager: MLA keeps every token's latent row, exactly
# like full attention.
_BUILTIN_MANAGERS: dict[type[KVCacheSpec], type[SingleTypeKVCacheManager]] = {
    FullAttentionSpec: FullAttentionManager,
    SlidingWindowSpec: SlidingWindowManager,
    SlidingWindowMLASpec: SlidingWindowManager,
    MambaSpec: MambaManager,
    ChunkedLocalAttentionSpec: ChunkedLocalAttentionManager,
    CrossAttentionSpec: CrossAttentionManager,
    MLAAttentionSpec: FullAttentionManager,
    RSWASpec: RSWAManager,
    SinkFullAttentionSpec: FullAttentionManager,
}


def register_all_kvcache_specs(vllm_config: "VllmConfig | None" = None) -> None:
    """Register the built-in spec types with their managers and grouping bases
    (upstream's names; upstream's tests pass `vllm_config`, which none of the
    built-in registrations needs). Re-registering is a no-op."""
    for spec_cls, manager_class in _BUILTIN_MANAGERS.items():
        KVCacheSpecRegistry.register(spec_cls, manager_class, spec_cls.default_uniform_type_base())


def get_manager_for_kv_cache_spec(
    kv_cache_spec: KVCacheSpec, **kwargs: Unpack[ManagerArgs]
) -> SingleTypeKVCacheManager:
    """Build the manager registered for the spec's type (or nearest base),
    registering the built-in ones first if that has not happened yet."""
    manager_class = KVCacheSpecRegistry.get_manager_class(kv_cache_spec)
    if manager_class is None:
        register_all_kvcache_specs()
        manager_class = KVCacheSpecRegistry.get_manager_class(kv_cache_spec)
    if manager_class is None:
        raise NotImplementedError(f"No KV cache manager for {type(kv_cache_spec).__name__}.")
    manager = manager_class(kv_cache_spec, **kwargs)
    assert isinstance(manager, SingleTypeKVCacheManager), manager_class
    return manager
