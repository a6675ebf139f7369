"""What every per-group KV cache manager shares: `SingleTypeKVCacheManager`.

A manager keeps each request's block table (``req_to_blocks``) for its KV
cache group, over the block pool all groups share: it counts the blocks an
allocation needs, references prefix-cache hits, appends new blocks, caches
full ones and frees them. Each attention type (`single_type_kv_cache_manager.py`
and the modules it imports) adds its rules: which cached blocks make a hit
(`_find_hit`, given one `CacheHitSearch`) and which blocks a request may drop
early (`get_num_skipped_tokens`).
"""

from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Required, TypedDict

from vllm.utils import cdiv
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import BlockHash, KVCacheBlock
from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheSpec

if TYPE_CHECKING:
    from vllm.v1.request import Request


class ManagerArgs(TypedDict, total=False):
    """The keyword arguments of every manager's constructor (after the spec)."""

    block_pool: Required[BlockPool]
    enable_caching: Required[bool]
    kv_cache_group_id: Required[int]
    scheduler_block_size: int | None
    needs_kv_cache_zeroing: bool
    max_admission_blocks_per_request: int | None


class SingleTypeKVCacheManager(ABC):
    """Block tables of one KV cache group, over the shared block pool.

    Args:
        kv_cache_spec: The spec of the group.
        block_pool: The pool shared by all groups.
        enable_caching: Whether prefix caching is enabled.
        kv_cache_group_id: The id of the group.
        scheduler_block_size: The scheduler's allocation granularity; must
            equal the spec's block size (mixed block sizes are not built).
        needs_kv_cache_zeroing: Record the ids of new attention blocks (see
            take_new_block_ids) for the worker to zero before use.
        max_admission_blocks_per_request: Most blocks one request holds at
            once (windowed specs recycle blocks); None for no cap.
    """

    def __init__(
        self,
        kv_cache_spec: KVCacheSpec,
        block_pool: BlockPool,
        enable_caching: bool,
        kv_cache_group_id: int,
        scheduler_block_size: int | None = None,
        needs_kv_cache_zeroing: bool = False,
        max_admission_blocks_per_request: int | None = None,
    ) -> None:
        self.block_size = kv_cache_spec.block_size
        # The scheduler's allocation granularity; a multiple of block_size
        # only with groups of mixed block sizes, which are not built.
        if scheduler_block_size is not None and scheduler_block_size != self.block_size:
            raise NotImplementedError(
                f"scheduler_block_size={scheduler_block_size} differs from the group's "
                f"block size {self.block_size}: mixed block sizes are not built."
            )
        # Per-request block cap of the admission check (windowed specs recycle
        # blocks, so a request never holds more than this); None = no cap.
        self._max_admission_blocks_per_request = max_admission_blocks_per_request
        # Attention blocks handed out since the last take_new_block_ids(),
        # when the worker must zero new blocks before use.
        self._record_new_block_ids = needs_kv_cache_zeroing and isinstance(
            kv_cache_spec, AttentionSpec
        )
        self.new_block_ids: list[int] = []
        self.kv_cache_spec = kv_cache_spec
        self.block_pool = block_pool
        self.enable_caching = enable_caching
        self.kv_cache_group_id = kv_cache_group_id
        # request id -> its blocks, in token order (null blocks where dropped).
        self.req_to_blocks: defaultdict[str, list[KVCacheBlock]] = defaultdict(list)
        # request id -> how many leading blocks are already in the prefix cache.
        # Present only for requests that hold blocks (running ones).
        self.num_cached_block: dict[str, int] = {}
        self._null_block = block_pool.null_block

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_local_computed_tokens: int | None = None,
        num_tokens_main_model: int | None = None,
        apply_admission_cap: bool = False,
    ) -> int:
        """Free blocks needed to give the request ``num_tokens`` slots.

        Args:
            request_id: The request.
            num_tokens: Tokens that need a slot, including already allocated.
            new_computed_blocks: Prefix-cache hits about to be added.
            total_computed_tokens: Tokens computed once the hits are added.
            num_local_computed_tokens, num_tokens_main_model: upstream's
                split of the above for KV connectors / speculative decoding
                (not built): only used to check they say the same.
            apply_admission_cap: Cap the blocks a request needs at
                max_admission_blocks_per_request (admission checks).

        Returns:
            New blocks to take, plus hit blocks that are currently free (taking
            a reference pulls them out of the free queue too).
        """
        assert num_tokens_main_model is None or num_tokens_main_model <= num_tokens
        assert (
            num_local_computed_tokens is None or num_local_computed_tokens <= total_computed_tokens
        )
        num_required_blocks = cdiv(num_tokens, self.block_size)
        if apply_admission_cap and self._max_admission_blocks_per_request is not None:
            num_required_blocks = min(num_required_blocks, self._max_admission_blocks_per_request)
        num_req_blocks = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:
            # A running request gets no new prefix hits.
            assert len(new_computed_blocks) == 0
            return max(num_required_blocks - num_req_blocks, 0)

        # Blocks wholly out of the attention window are never allocated.
        num_skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        num_local_blocks = num_req_blocks + len(new_computed_blocks)
        num_new_blocks = max(num_required_blocks - max(num_skipped_blocks, num_local_blocks), 0)
        skipped_hits = max(0, num_skipped_blocks - num_req_blocks)
        num_evictable_hits = sum(
            block.ref_cnt == 0 and not block.is_null for block in new_computed_blocks[skipped_hits:]
        )
        return num_new_blocks + num_evictable_hits

    def save_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
    ) -> None:
        """Add prefix-cache hits to a new request's block table.

        Hits already out of the attention window are replaced by null blocks
        instead of being referenced. Running requests get no hits.
        """
        if request_id in self.num_cached_block:
            assert len(new_computed_blocks) == 0, "a running request got new hits"
            return
        req_blocks = self.req_to_blocks[request_id]
        assert len(req_blocks) == 0
        # May exceed the hits when the window also moved past tokens computed
        # elsewhere (external); those positions get null blocks as well.
        num_skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        kept_blocks = new_computed_blocks[num_skipped_blocks:]
        if self.enable_caching:
            self.block_pool.touch(kept_blocks)
        else:
            assert not kept_blocks, "prefix cache hits while caching is disabled"
        req_blocks.extend([self._null_block] * num_skipped_blocks)
        req_blocks.extend(kept_blocks)
        # Hits are cached already; cache_blocks() must not hash them again.
        self.num_cached_block[request_id] = len(req_blocks)

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        """Upstream's name for save_new_computed_blocks, with the computed
        tokens split into local hits and external (connector) tokens. Hits are
        whole blocks here (partial-block hits are not built)."""
        if num_local_computed_tokens % self.block_size:
            raise NotImplementedError("Partial-block prefix-cache hits are not built.")
        self.save_new_computed_blocks(
            request_id,
            new_computed_blocks,
            num_local_computed_tokens + num_external_computed_tokens,
        )

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int | None = None
    ) -> list[KVCacheBlock]:
        """Append blocks until the request has ``num_tokens`` slots.
        (``num_tokens_main_model``: upstream's count without draft-model
        lookahead slots; without speculative decoding it is num_tokens.)

        Returns:
            The newly taken blocks (possibly none).
        """
        req_blocks = self.req_to_blocks[request_id]
        num_new_blocks = cdiv(num_tokens, self.block_size) - len(req_blocks)
        if num_new_blocks <= 0:
            return []
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        req_blocks.extend(new_blocks)
        if self._record_new_block_ids:
            self.new_block_ids.extend(block.block_id for block in new_blocks)
        return new_blocks

    @property
    def records_new_block_ids(self) -> bool:
        """Whether the worker zeroes this manager's new blocks."""
        return self._record_new_block_ids

    def take_new_block_ids(self) -> list[int]:
        """The block ids handed out since the last call."""
        ids, self.new_block_ids = self.new_block_ids, []
        return ids

    def cache_blocks(self, request: "Request", num_tokens: int) -> None:
        """Register the request's full blocks among its first ``num_tokens``
        tokens in the prefix cache (those not registered yet)."""
        num_cached_blocks = self.num_cached_block.get(request.request_id, 0)
        num_full_blocks = num_tokens // self.block_size
        if num_cached_blocks >= num_full_blocks:
            return
        self.block_pool.cache_full_blocks(
            request=request,
            blocks=self.req_to_blocks[request.request_id],
            num_cached_blocks=num_cached_blocks,
            num_full_blocks=num_full_blocks,
            block_size=self.block_size,
            kv_cache_group_id=self.kv_cache_group_id,
        )
        self.num_cached_block[request.request_id] = num_full_blocks

    def free(self, request_id: str) -> None:
        """Release all blocks of the request (a no-op if it holds none).

        Tail blocks are freed first, so of this request's cached blocks the
        tail of the chain (least likely to be shared) is evicted first.
        """
        req_blocks = self.req_to_blocks.pop(request_id, [])
        self.block_pool.free_blocks(reversed(req_blocks))
        self.num_cached_block.pop(request_id, None)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        """Free the blocks the attention will skip from now on and put null
        blocks in their place (e.g. blocks that left the sliding window)."""
        num_skipped_tokens = self.get_num_skipped_tokens(total_computed_tokens)
        if num_skipped_tokens <= 0:
            return
        blocks = self.req_to_blocks[request_id]
        # Tokens not yet allocated can also be "skipped"; cap to what exists.
        num_skipped_blocks = min(num_skipped_tokens // self.block_size, len(blocks))
        removed_blocks: list[KVCacheBlock] = []
        # Walk backwards and stop at the first null block: everything before it
        # was nulled by an earlier call.
        for i in range(num_skipped_blocks - 1, -1, -1):
            if blocks[i].is_null:
                break
            removed_blocks.append(blocks[i])
            blocks[i] = self._null_block
        self.block_pool.free_blocks(removed_blocks)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens the next attention step will not read (none by
        default)."""
        return 0

    @abstractmethod
    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        """Leading blocks of ``running_request_id`` shared by every request
        that holds blocks (used for cascade attention)."""
        raise NotImplementedError

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[BlockHash],
        max_length: int,
        kv_cache_group_ids: list[int],
        block_pool: BlockPool,
        kv_cache_spec: KVCacheSpec,
        drop_eagle_block: bool,
        alignment_tokens: int,
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        """The longest usable prefix-cache hit of at most ``max_length`` tokens.

        Args:
            block_hashes: The request's block hashes.
            max_length: Upper bound on the hit, in tokens.
            kv_cache_group_ids: The groups (of this attention type) to look in;
                a block hits only if it is cached in all of them.
            block_pool: The block pool.
            kv_cache_spec: The groups' spec.
            drop_eagle_block: Drop the last hit block: EAGLE must recompute it
                to get the hidden states its draft head needs.
            alignment_tokens: The hit length must be a multiple of this.

        Returns:
            Per group, the hit blocks (blocks the attention skips are null
            blocks, e.g. ``[NULL, NULL, 7, 8]`` for a sliding window of two
            blocks), and the hit length in tokens.
        """
        block_size = kv_cache_spec.block_size
        # Positional, in field order: each argument is named as its field.
        hit_blocks = cls._find_hit(
            CacheHitSearch(
                block_hashes,
                max_length // block_size,
                kv_cache_group_ids,
                block_pool,
                kv_cache_spec,
                drop_eagle_block,
                alignment_tokens,
                block_size,
                max_length,
            )
        )
        return hit_blocks, len(hit_blocks[0]) * block_size if hit_blocks else 0

    @classmethod
    @abstractmethod
    def _find_hit(cls, search: "CacheHitSearch") -> tuple[list[KVCacheBlock], ...]:
        """This attention type's rule for find_longest_cache_hit()."""
        raise NotImplementedError


@dataclass(frozen=True)
class CacheHitSearch:
    """The inputs of one find_longest_cache_hit() call, in blocks."""

    block_hashes: Sequence[BlockHash]
    # max_length // block_size: whole blocks only.
    max_num_blocks: int
    kv_cache_group_ids: list[int]
    block_pool: BlockPool
    kv_cache_spec: KVCacheSpec
    use_eagle: bool
    alignment_tokens: int
    # Tokens per block (the spec's block size).
    block_size: int
    # The bound in tokens (chunked local attention needs the exact position).
    max_length: int

    def no_hit(self) -> tuple[list[KVCacheBlock], ...]:
        return tuple([] for _ in self.kv_cache_group_ids)

    def drop_eagle_block(self, computed_blocks: tuple[list[KVCacheBlock], ...]) -> None:
        """With EAGLE, drop the last hit block from every group (if any)."""
        if self.use_eagle and computed_blocks[0]:
            for computed in computed_blocks:
                computed.pop()

    def align(self, computed_blocks: tuple[list[KVCacheBlock], ...]) -> None:
        """Pop tail blocks until the hit length is a multiple of alignment_tokens."""
        while len(computed_blocks[0]) * self.block_size % self.alignment_tokens != 0:
            for computed in computed_blocks:
                computed.pop()
