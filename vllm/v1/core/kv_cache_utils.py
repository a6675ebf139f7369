"""KV-cache utilities: block hashes, block metadata and the free-block queue.

The KV-cache planning helpers (how many blocks fit in memory, how tensors are
laid out) live in ``kv_cache_planning.py`` and are re-exported here, which is
where callers import them from.
"""

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm.logger import init_logger
from vllm.utils.hashing import xxhash, xxhash_cbor
from vllm.v1.core.block_hash import (
    BlockHash,
    BlockHashWithGroupId,
    ExternalBlockHash,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
)

# Re-exported (listed in __all__): callers import the planning API from this
# module, upstream's path for it.
from vllm.v1.core.kv_cache_planning import (
    check_enough_kv_cache_memory,
    estimate_max_model_len,
    generate_scheduler_kv_cache_config,
    get_kv_cache_capacity,
    get_kv_cache_config_from_groups,
    get_kv_cache_configs,
    get_kv_cache_groups,
    get_max_concurrency_for_kv_cache_config,
    get_num_blocks,
    group_and_unify_kv_cache_specs,
    is_kv_cache_spec_uniform,
    max_memory_usage_bytes,
    may_override_num_blocks,
    unify_hybrid_kv_cache_specs,
)
from vllm.v1.utils import tensor_data

if TYPE_CHECKING:
    from vllm.v1.request import Request

logger = init_logger(__name__)

# The parent hash of the first block of every request. Set by `init_none_hash`
# (the engine core calls it with the configured hash function at start-up).
NONE_HASH: BlockHash

# Seed of NONE_HASH when PYTHONHASHSEED is unset and the hash is cryptographic:
# a fixed seed lets separate processes compute identical block hashes, and
# SHA-256's collision resistance does not depend on the seed being secret.
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"

# Hashes that are not collision resistant. Their seed must stay secret, or an
# attacker could precompute colliding blocks, so it is random per process.
_NON_CRYPTO_HASH_FUNCTIONS = frozenset({xxhash, xxhash_cbor})


def resolve_none_hash_seed(hash_fn: Callable[[Any], bytes]) -> str:
    """PYTHONHASHSEED if set; else the fixed default (cryptographic hashes) or
    32 random bytes in hex (non-cryptographic ones)."""
    hash_seed = os.getenv("PYTHONHASHSEED")
    if hash_seed is not None:
        return hash_seed
    if hash_fn in _NON_CRYPTO_HASH_FUNCTIONS:
        return os.urandom(32).hex()
    return DEFAULT_NONE_HASH_SEED


def init_none_hash(hash_fn: Callable[[Any], bytes]) -> None:
    """Set the module-level NONE_HASH to ``hash_fn(seed)``."""
    global NONE_HASH
    seed = resolve_none_hash_seed(hash_fn)
    if hash_fn in _NON_CRYPTO_HASH_FUNCTIONS and os.getenv("PYTHONHASHSEED") is None:
        logger.warning(
            "Using a random per-process NONE_HASH seed because %s is not "
            "collision resistant; set PYTHONHASHSEED to share block hashes "
            "across processes.",
            hash_fn.__name__,
        )
    NONE_HASH = BlockHash(hash_fn(seed))


@dataclass(slots=True)
class KVCacheBlock:
    """Metadata of one KV-cache block (the tensors live in the worker)."""

    # Block id, from 0 to num_gpu_blocks - 1. Block 0 is the pool's null block.
    block_id: int
    # Number of requests using the block. 0 means it sits in the free queue.
    ref_cnt: int = 0
    # Cache key (block hash + group id); set only while the block is full and
    # registered in the prefix cache.
    _block_hash: BlockHashWithGroupId | None = None

    # Links of the free-block doubly linked list; only FreeKVCacheBlockQueue
    # touches them.
    prev_free_block: "KVCacheBlock | None" = None
    next_free_block: "KVCacheBlock | None" = None

    # The null block stands in for blocks a request no longer needs (e.g. out
    # of a sliding window); it is never freed, hashed or handed out.
    is_null: bool = False

    @property
    def block_hash(self) -> BlockHashWithGroupId | None:
        return self._block_hash

    @block_hash.setter
    def block_hash(self, block_hash: BlockHashWithGroupId) -> None:
        assert self._block_hash is None, "The block already has a hash."
        self._block_hash = block_hash

    def set_block_hash(
        self, block_hash: BlockHashWithGroupId, num_tokens: int | None = None
    ) -> None:
        """Upstream's setter. ``num_tokens`` (tokens the hash covers) is for
        partially filled cached blocks, which are not built: a hash here always
        covers a full block, so only None is accepted."""
        if num_tokens is not None:
            raise NotImplementedError("Caching partially filled blocks is not built.")
        self.block_hash = block_hash

    def reset_hash(self) -> None:
        """Forget the hash when the block is evicted from the prefix cache."""
        self._block_hash = None

    def __repr__(self) -> str:
        # Print neighbour ids only: printing the neighbours would recurse
        # through the whole free list.
        prev_id = self.prev_free_block.block_id if self.prev_free_block else None
        next_id = self.next_free_block.block_id if self.next_free_block else None
        return (
            f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, "
            f"_block_hash={self._block_hash!r}, prev_free_block={prev_id}, "
            f"next_free_block={next_id})"
        )


class FreeKVCacheBlockQueue:
    """The free blocks, as a doubly linked list in eviction order.

    Why hand-rolled: a prefix-cache hit must pull a block out of the *middle* of
    the free list (it is no longer evictable). `collections.deque` removes from
    the middle in O(n); this list does it in O(1). It also allocates no Python
    objects while it runs: it only rewires the `prev_free_block` /
    `next_free_block` fields of the blocks themselves, which keeps it close to
    deque's speed for the common pops and appends.

    Eviction order (front = evicted first):
    1. At start the list is ordered by block id.
    2. Freed blocks with a hash go to the back, so the least recently used
       cached block is at the front (LRU).
    3. Blocks freed together (one request) are freed in reverse, so the tail
       of a request's chain (the block with the most hashed tokens, least
       likely to be shared) is evicted before its head. The reversing is done
       by the caller.
    4. Freed blocks without a hash can never give a cache hit, so the block
       pool prepends them: they are reused before any cached block.

    A fake head and a fake tail are always present, so every real block in the
    list has both neighbours and no operation needs an emptiness branch.
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self.fake_free_list_head = KVCacheBlock(block_id=-1)
        self.fake_free_list_tail = KVCacheBlock(block_id=-1)
        self._link([self.fake_free_list_head, *blocks, self.fake_free_list_tail])

    @staticmethod
    def _link(chain: Sequence[KVCacheBlock]) -> None:
        """Link consecutive blocks of ``chain`` to each other."""
        for prev_block, next_block in zip(chain, chain[1:]):
            prev_block.next_free_block = next_block
            next_block.prev_free_block = prev_block

    def popleft(self) -> KVCacheBlock:
        """Pop the front (next to evict) block."""
        first_block = self.fake_free_list_head.next_free_block
        if first_block is None or first_block is self.fake_free_list_tail:
            assert self.num_free_blocks == 0, "num_free_blocks out of sync"
            raise ValueError("No free blocks available")
        self.remove(first_block)
        return first_block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Pop the ``n`` front blocks, in order. The caller checks ``n``."""
        if n == 0:
            return []
        assert self.num_free_blocks >= n
        self.num_free_blocks -= n
        popped: list[KVCacheBlock] = []
        curr_block = self.fake_free_list_head.next_free_block
        for _ in range(n):
            assert curr_block is not None
            popped.append(curr_block)
            next_block = curr_block.next_free_block
            curr_block.prev_free_block = curr_block.next_free_block = None
            curr_block = next_block
        # Relink once, after the loop, instead of once per popped block.
        assert curr_block is not None
        self._link([self.fake_free_list_head, curr_block])
        return popped

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink ``block`` from wherever it is in the list."""
        if block.prev_free_block is None or block.next_free_block is None:
            raise RuntimeError(f"remove() called on a block not in the list: {block}")
        self._link([block.prev_free_block, block.next_free_block])
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Put ``block`` at the back (evicted last)."""
        self.append_n([block])

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        """Put ``blocks`` at the back, keeping their order."""
        if not blocks:
            return
        last_block = self.fake_free_list_tail.prev_free_block
        assert last_block is not None, "the fake tail always has a prev block"
        self._link([last_block, *blocks, self.fake_free_list_tail])
        self.num_free_blocks += len(blocks)

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        """Put ``blocks`` at the front (evicted first), keeping their order."""
        if not blocks:
            return
        first_block = self.fake_free_list_head.next_free_block
        assert first_block is not None, "the fake head always has a next block"
        self._link([self.fake_free_list_head, *blocks, first_block])
        self.num_free_blocks += len(blocks)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """All free blocks, front to back. For tests and integrity checks."""
        free_blocks: list[KVCacheBlock] = []
        curr_block = self.fake_free_list_head.next_free_block
        while curr_block is not None and curr_block is not self.fake_free_list_tail:
            free_blocks.append(curr_block)
            curr_block = curr_block.next_free_block
        return free_blocks


def _gen_lora_extra_hash_keys(request: "Request") -> list[str | int]:
    """The adapter's name and id: blocks computed with different adapters
    never match. Upstream keys by name only; the id is added because a name
    can come back with other weights (the server unloads an adapter and loads
    another under the same name, or reloads it in place, each time with a new
    lora_int_id), and blocks computed with the old weights must not be reused."""
    lora = request.lora_request
    if lora is None:
        return []
    return [lora.lora_name, lora.lora_int_id]


def _gen_prompt_embeds_extra_hash_keys(
    request: "Request", start_token_idx: int, end_token_idx: int
) -> list[bytes]:
    """A digest of the block's prompt embeddings, when the prompt is embeds.

    Such prompts carry placeholder token ids, so the ids alone say nothing
    about the block's contents. The digest is cached on the request per block
    range: the extra keys of a block are computed again for its KV cache
    event (BlockStored), so the rows are hashed only once.
    """
    if request.prompt_embeds is None:
        return []
    block_range = (start_token_idx, end_token_idx)
    digest = request._prompt_embeds_per_block_hashes.get(block_range)
    if digest is None:
        block_embeds = request.prompt_embeds[start_token_idx:end_token_idx]
        digest = hashlib.sha256(tensor_data(block_embeds)).digest()
        request._prompt_embeds_per_block_hashes[block_range] = digest
    return [digest]


def _gen_mm_extra_hash_keys(
    request: "Request", start_token_idx: int, end_token_idx: int, start_mm_idx: int
) -> tuple[list[Any], int]:
    """(identifier, offset of the item relative to the block start) for each
    multimodal item whose placeholder overlaps the block, and the index of the
    item the next block starts looking at. Items are sorted by offset;
    ``start_mm_idx`` -1 means the last item."""
    features = request.mm_features
    if not features:
        return [], start_mm_idx
    last = features[-1].mm_position
    if last.offset + last.length <= start_token_idx:
        return [], start_mm_idx  # past every item (late prefill, decode)
    if start_mm_idx < 0:
        start_mm_idx += len(features)
    keys: list[Any] = []
    idx = start_mm_idx
    while idx < len(features):
        offset = features[idx].mm_position.offset
        end = offset + features[idx].mm_position.length
        if end_token_idx <= offset:
            break  # the block ends before this item
        if start_token_idx >= end:
            idx += 1  # the block starts after this item
            continue
        # The relative offset keeps keys distinct when one item sits at
        # different places in otherwise identical placeholder blocks.
        keys.append((features[idx].identifier, offset - start_token_idx))
        if end_token_idx < end:
            break  # the item continues into the next block
        idx += 1
    return keys, idx


def generate_block_hash_extra_keys(
    request: "Request", start_token_idx: int, end_token_idx: int, start_mm_idx: int
) -> tuple[tuple[Any, ...] | None, int]:
    """Keys besides the token ids that make a block's contents unique.

    Order (upstream's): LoRA name, multimodal items, cache salt (first block
    only: the hash chain carries it into every later block), prompt-embeds
    digest.

    Returns:
        The extra keys (None when there are none) and the next multimodal index.
    """
    mm_keys, next_mm_idx = _gen_mm_extra_hash_keys(
        request, start_token_idx, end_token_idx, start_mm_idx
    )
    salt_keys = [request.cache_salt] if start_token_idx == 0 and request.cache_salt else []
    extra_keys: list[Any] = [
        *_gen_lora_extra_hash_keys(request),
        *mm_keys,
        *salt_keys,
        *_gen_prompt_embeds_extra_hash_keys(request, start_token_idx, end_token_idx),
    ]
    return (tuple(extra_keys) if extra_keys else None), next_mm_idx


def hash_block_tokens(
    hash_function: Callable[[Any], bytes],
    parent_block_hash: BlockHash | None,
    curr_block_token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
) -> BlockHash:
    """Hash of one full block, chained to its parent's hash.

    ``hash_function((parent or NONE_HASH, tuple(token_ids), extra_keys))``: the
    parent hash makes equal blocks at different positions or after different
    prefixes hash differently.
    """
    if not parent_block_hash:
        parent_block_hash = NONE_HASH
    return BlockHash(hash_function((parent_block_hash, tuple(curr_block_token_ids), extra_keys)))


def get_request_block_hasher(
    block_size: int, caching_hash_fn: Callable[[Any], bytes]
) -> Callable[["Request"], list[BlockHash]]:
    """Return ``fn(request) -> hashes of the request's new full blocks``.

    The request calls it when created and whenever tokens are appended, and
    extends ``request.block_hashes`` with the result; the hashes chain on from
    ``request.block_hashes[-1]``. A trailing partial block is never hashed.
    """

    def request_block_hasher(request: "Request") -> list[BlockHash]:
        start_token_idx = len(request.block_hashes) * block_size
        num_tokens = request.num_tokens
        parent_hash = request.block_hashes[-1] if request.block_hashes else None
        new_block_hashes: list[BlockHash] = []
        curr_mm_idx = 0
        while start_token_idx + block_size <= num_tokens:
            end_token_idx = start_token_idx + block_size
            extra_keys, curr_mm_idx = generate_block_hash_extra_keys(
                request, start_token_idx, end_token_idx, curr_mm_idx
            )
            block_tokens = request.all_token_ids[start_token_idx:end_token_idx]
            parent_hash = hash_block_tokens(caching_hash_fn, parent_hash, block_tokens, extra_keys)
            new_block_hashes.append(parent_hash)
            start_token_idx = end_token_idx
        return new_block_hashes

    return request_block_hasher


__all__ = [
    "BlockHash",
    "BlockHashWithGroupId",
    "DEFAULT_NONE_HASH_SEED",
    "ExternalBlockHash",
    "FreeKVCacheBlockQueue",
    "KVCacheBlock",
    "check_enough_kv_cache_memory",
    "estimate_max_model_len",
    "generate_block_hash_extra_keys",
    "generate_scheduler_kv_cache_config",
    "get_block_hash",
    "get_group_id",
    "get_kv_cache_capacity",
    "get_kv_cache_config_from_groups",
    "get_kv_cache_configs",
    "get_kv_cache_groups",
    "get_max_concurrency_for_kv_cache_config",
    "get_num_blocks",
    "get_request_block_hasher",
    "group_and_unify_kv_cache_specs",
    "hash_block_tokens",
    "init_none_hash",
    "is_kv_cache_spec_uniform",
    "make_block_hash_with_group_id",
    "max_memory_usage_bytes",
    "may_override_num_blocks",
    "maybe_convert_block_hash",
    "resolve_none_hash_seed",
    "unify_hybrid_kv_cache_specs",
]
