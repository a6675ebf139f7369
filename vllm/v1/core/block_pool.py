"""The pool of KV-cache blocks: allocation, freeing and the prefix cache.

Block 0 is the null block (popped at start-up, never freed: it fills the
block-table entries a sliding-window, chunked-local or Mamba group skips).
Free blocks sit in a doubly linked free queue in eviction order; a free block
keeps its hash in the prefix-cache map until it is reused. With `enable_kv_cache_events`
every store / removal / clear is recorded as a `vllm.distributed.kv_events`
event.
"""

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)
from vllm.logger import init_logger
from vllm.v1.core.kv_cache_utils import (
    BlockHash,
    BlockHashWithGroupId,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    generate_block_hash_extra_keys,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
)

if TYPE_CHECKING:
    from vllm.v1.request import Request

logger = init_logger(__name__)


class BlockHashToBlockMap:
    """The prefix cache: cache key (block hash + group id) -> cached block(s).

    A key usually maps to one block. It maps to several when two requests
    computed the same block independently: blocks are never de-duplicated,
    because a running request's block table must stay append-only (its ids
    cannot be swapped for an equal block's). Values are a bare KVCacheBlock in
    the common case and a {block_id: block} dict otherwise, which saves one
    dict per cached block (less garbage-collector work).
    """

    def __init__(self) -> None:
        self._cache: dict[BlockHashWithGroupId, KVCacheBlock | dict[int, KVCacheBlock]] = {}

    def get_one_block(self, key: BlockHashWithGroupId) -> KVCacheBlock | None:
        """Any block cached under ``key``, or None."""
        blocks = self._cache.get(key)
        if blocks is None or isinstance(blocks, KVCacheBlock):
            return blocks
        return next(iter(blocks.values()))

    def insert(self, key: BlockHashWithGroupId, block: KVCacheBlock) -> None:
        """Cache ``block`` under ``key`` (next to any equal block)."""
        blocks = self._cache.get(key)
        if blocks is None:
            self._cache[key] = block
        elif isinstance(blocks, KVCacheBlock):
            self._cache[key] = {blocks.block_id: blocks, block.block_id: block}
        else:
            blocks[block.block_id] = block

    def pop(self, key: BlockHashWithGroupId, block_id: int) -> KVCacheBlock | None:
        """Remove block ``block_id`` from ``key``; return it, or None if absent."""
        blocks = self._cache.get(key)
        if blocks is None:
            return None
        if isinstance(blocks, KVCacheBlock):
            if blocks.block_id != block_id:
                return None
            del self._cache[key]
            return blocks
        block = blocks.pop(block_id, None)
        if not blocks:
            del self._cache[key]
        return block

    def __len__(self) -> int:
        return len(self._cache)


class BlockPool:
    """Owns every KVCacheBlock: allocates, frees and caches them.

    ``free_block_queue`` holds the blocks with ref_cnt 0 in eviction order; a
    free block may still be in the prefix cache (``cached_block_hash_to_block``)
    until it is handed out again, which is when its hash is evicted. Block 0 is
    the null block: it is taken out of the queue at start and never freed,
    cached or handed out.

    Args:
        num_gpu_blocks: The number of blocks in the pool (null block included).
        enable_caching: Whether prefix caching is enabled.
        hash_block_size: The block size the request's block hashes are computed
            with; equal to the block size of the (single) KV cache group.
        enable_kv_cache_events: Record a `vllm.distributed.kv_events` event
            for every change to the prefix cache (`take_events()` hands them
            over): blocks stored, blocks evicted, cache cleared.
    """

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool,
        hash_block_size: int,
        enable_kv_cache_events: bool = False,
    ) -> None:
        if num_gpu_blocks <= 0:
            raise ValueError(f"num_gpu_blocks must be positive, got {num_gpu_blocks}")
        self.enable_kv_cache_events = enable_kv_cache_events
        self.kv_event_queue: list[KVCacheEvent] = []
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.blocks: list[KVCacheBlock] = [KVCacheBlock(idx) for idx in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        # Placeholder for blocks a request no longer needs. Its ref_cnt is not
        # maintained: every path that frees or queues blocks skips it.
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True

    def get_cached_block(
        self, block_hash: BlockHash, kv_cache_group_ids: list[int]
    ) -> list[KVCacheBlock] | None:
        """The cached block of ``block_hash`` in each group, or None if any
        group misses."""
        cached_blocks = []
        for group_id in kv_cache_group_ids:
            key = make_block_hash_with_group_id(block_hash, group_id)
            block = self.cached_block_hash_to_block.get_one_block(key)
            if block is None:
                return None
            cached_blocks.append(block)
        return cached_blocks

    def cache_full_blocks(
        self,
        request: "Request",
        blocks: list[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
    ) -> None:
        """Register ``blocks[num_cached_blocks:num_full_blocks]`` in the cache.

        Each block gets the request's block hash of its position (the request
        computes them as tokens arrive) plus the group id. Null blocks (e.g.
        dropped from a sliding window) are skipped.

        Args:
            request: The request owning the blocks.
            blocks: All blocks of the request in this group.
            num_cached_blocks: Blocks already cached (a prefix of ``blocks``).
            num_full_blocks: Blocks that are full and should be cached after
                this call.
            block_size: Tokens per block.
            kv_cache_group_id: The group the blocks belong to.
        """
        if num_cached_blocks >= num_full_blocks:
            return
        assert block_size == self.hash_block_size, "block hashes are per block"
        assert len(request.block_hashes) >= num_full_blocks
        for block_idx in range(num_cached_blocks, num_full_blocks):
            block = blocks[block_idx]
            if block.is_null:
                continue
            key = make_block_hash_with_group_id(request.block_hashes[block_idx], kv_cache_group_id)
            block.block_hash = key
            self.cached_block_hash_to_block.insert(key, block)
        if self.enable_kv_cache_events:
            # Collected here, not in the loop: nothing per block when events are off.
            stored = [
                idx for idx in range(num_cached_blocks, num_full_blocks) if not blocks[idx].is_null
            ]
            self.kv_event_queue.append(
                _block_stored_event(
                    request,
                    stored,
                    num_cached_blocks,
                    num_full_blocks,
                    block_size,
                    kv_cache_group_id,
                )
            )

    def emit_cached_block_events(
        self, request: "Request", num_cached_blocks: int, block_size: int, kv_cache_group_id: int
    ) -> None:
        """A BlockStored event for the request's first ``num_cached_blocks``
        blocks, which it reuses from the prefix cache (blocks unchanged), so a
        consumer tracking the cache learns they are in use again."""
        if not self.enable_kv_cache_events or num_cached_blocks == 0:
            return
        self.kv_event_queue.append(
            _block_stored_event(
                request,
                list(range(num_cached_blocks)),
                0,
                num_cached_blocks,
                block_size,
                kv_cache_group_id,
            )
        )

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take ``num_blocks`` blocks from the front of the free queue.

        A taken block that is still in the prefix cache is evicted from it.
        Each returned block has ref_cnt 1.

        Raises:
            ValueError: If fewer than ``num_blocks`` blocks are free.
        """
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        new_blocks = self.free_block_queue.popleft_n(num_blocks)
        for block in new_blocks:
            if self.enable_caching:
                self._maybe_evict_cached_block(block)
            assert block.ref_cnt == 0 and block.block_hash is None
            block.ref_cnt = 1
        return new_blocks

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Drop ``block`` from the prefix cache and clear its hash.

        Returns:
            True if the block was in the cache, False otherwise.
        """
        block_hash = block.block_hash
        if block_hash is None:
            return False
        if self.cached_block_hash_to_block.pop(block_hash, block.block_id) is None:
            return False
        block.reset_hash()
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(
                BlockRemoved(
                    block_hashes=[maybe_convert_block_hash(get_block_hash(block_hash))],
                    medium=MEDIUM_GPU,
                    group_idx=get_group_id(block_hash),
                )
            )
        return True

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Take a reference on prefix-cache hits.

        A hit block with ref_cnt 0 sits in the free queue as an eviction
        candidate; it is pulled out so it cannot be handed to someone else.
        """
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference on each block; queue those that reach 0.

        ``ordered_blocks`` is in eviction priority: of the blocks that become
        free, the first is evicted first. Blocks with a hash go to the back of
        the queue (kept for prefix hits as long as possible, LRU). Blocks
        without one can never be hit, so they go to the front to be reused
        first (also when caching is off: recently used memory is reused).
        """
        evict_first: list[KVCacheBlock] = []
        evict_last: list[KVCacheBlock] = []
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.is_null or block.ref_cnt > 0:
                continue
            if block.ref_cnt < 0:
                raise AssertionError(f"block {block.block_id} freed more often than taken")
            if block.block_hash is None:
                evict_first.append(block)
            else:
                evict_last.append(block)
        self.free_block_queue.prepend_n(evict_first)
        self.free_block_queue.append_n(evict_last)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block, e.g. after the weights changed.

        Only possible when no request holds blocks (all but the null block are
        free).

        Returns:
            True if the cache was reset, False otherwise.
        """
        num_used_blocks = self.num_gpu_blocks - self.get_num_free_blocks()
        if num_used_blocks != 1:  # The null block is always in use.
            logger.warning(
                "Failed to reset prefix cache because some blocks (%d) are not freed yet",
                num_used_blocks - 1,
            )
            return False
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        for block in self.blocks:
            block.reset_hash()
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(AllBlocksCleared())
        logger.info("Successfully reset prefix cache")
        return True

    def get_num_free_blocks(self) -> int:
        """Blocks that can be handed out (free, cached or not)."""
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of blocks in use, the null block not counted (0.0 - 1.0)."""
        total_blocks = self.num_gpu_blocks - 1
        if total_blocks == 0:
            return 0.0
        return 1.0 - self.get_num_free_blocks() / total_blocks

    def take_events(self) -> list[KVCacheEvent]:
        """The KV cache events since the last call (empty when disabled)."""
        events, self.kv_event_queue = self.kv_event_queue, []
        return events

    def check_integrity(self) -> None:
        """Raise AssertionError unless the pool's invariants hold.

        - free + used == total: the queue holds exactly the non-null blocks
          with ref_cnt 0, once each, and the null block is never in it;
        - every cache entry points at a block carrying that key.
        """
        free_blocks = self.free_block_queue.get_all_free_blocks()
        free_ids = [block.block_id for block in free_blocks]
        if len(free_ids) != self.free_block_queue.num_free_blocks:
            raise AssertionError("num_free_blocks disagrees with the free list")
        if len(set(free_ids)) != len(free_ids) or 0 in free_ids:
            raise AssertionError(f"bad free list {free_ids}")
        used = [b for b in self.blocks if not b.is_null and b.ref_cnt > 0]
        if len(free_ids) + len(used) + 1 != self.num_gpu_blocks:
            raise AssertionError(
                f"free ({len(free_ids)}) + used ({len(used)}) + null != "
                f"total ({self.num_gpu_blocks})"
            )
        if any(block.ref_cnt != 0 for block in free_blocks):
            raise AssertionError("a block in the free list has references")
        for key, blocks in self.cached_block_hash_to_block._cache.items():
            group = [blocks] if isinstance(blocks, KVCacheBlock) else blocks.values()
            if any(block.block_hash != key for block in group):
                raise AssertionError("a cached block does not carry its cache key")


def _block_stored_event(
    request: "Request",
    stored: list[int],
    num_cached_blocks: int,
    num_full_blocks: int,
    block_size: int,
    kv_cache_group_id: int,
) -> BlockStored:
    """The event for blocks ``stored`` (indices into the request's blocks)
    newly cached; the tokens span every block from num_cached_blocks on."""
    hashes = request.block_hashes
    parent = (
        maybe_convert_block_hash(hashes[num_cached_blocks - 1]) if num_cached_blocks > 0 else None
    )
    extra_keys: list[tuple[Any, ...] | None] = []
    mm_idx = 0
    for idx in stored:  # each stored block's own extra keys, in order
        keys, mm_idx = generate_block_hash_extra_keys(
            request, idx * block_size, (idx + 1) * block_size, mm_idx
        )
        extra_keys.append(keys)
    lora = request.lora_request
    return BlockStored(
        block_hashes=[maybe_convert_block_hash(hashes[idx]) for idx in stored],
        parent_block_hash=parent,
        token_ids=list(
            request.all_token_ids[num_cached_blocks * block_size : num_full_blocks * block_size]
        ),
        block_size=block_size,
        lora_id=lora.adapter_id if lora else None,
        medium=MEDIUM_GPU,
        lora_name=lora.name if lora else None,
        extra_keys=extra_keys or None,
        group_idx=kv_cache_group_id,
    )
