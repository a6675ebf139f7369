"""The KV cache manager of chunked local attention groups (imported from
`vllm.v1.core.single_type_kv_cache_manager`, upstream's module for it).

A token at position p attends only to the tokens of its own chunk,
[p // C * C, p] for chunk size C. So every block wholly before the current
chunk is skipped: it counts as computed (a null block in the block table),
is freed once the request moves past it, and needs no cache hit.
"""

from typing import Unpack

from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.single_type_kv_cache_manager_base import (
    CacheHitSearch,
    ManagerArgs,
    SingleTypeKVCacheManager,
)
from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec


class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    """Block tables of a chunked-local-attention group."""

    def __init__(
        self, kv_cache_spec: ChunkedLocalAttentionSpec, **kwargs: Unpack[ManagerArgs]
    ) -> None:
        super().__init__(kv_cache_spec, **kwargs)
        self.attention_chunk_size = kv_cache_spec.attention_chunk_size

    @classmethod
    def _find_hit(cls, search: CacheHitSearch) -> tuple[list[KVCacheBlock], ...]:
        spec = search.kv_cache_spec
        assert isinstance(spec, ChunkedLocalAttentionSpec)
        if search.use_eagle:
            raise NotImplementedError("EAGLE with chunked local attention.")
        if search.alignment_tokens != spec.block_size:
            raise NotImplementedError(
                "Chunked local attention next to KV cache groups with other block sizes."
            )
        block_size = spec.block_size
        max_length = search.max_length
        # The next token (position max_length) reads from the start of its chunk;
        # the blocks before that are out of the window: null, but "computed".
        chunk_start = max_length // spec.attention_chunk_size * spec.attention_chunk_size
        num_skipped_blocks = chunk_start // block_size
        computed_blocks = tuple(
            [search.block_pool.null_block] * num_skipped_blocks for _ in search.kv_cache_group_ids
        )
        for i in range(num_skipped_blocks, search.max_num_blocks):
            cached = search.block_pool.get_cached_block(
                search.block_hashes[i], search.kv_cache_group_ids
            )
            if cached is None:
                break
            for computed, block in zip(computed_blocks, cached):
                computed.append(block)
        return computed_blocks

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        # Tokens of the chunks before the next token's chunk.
        return num_computed_tokens // self.attention_chunk_size * self.attention_chunk_size

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        # Leading blocks are null blocks: no shared prefix to report.
        return 0
