"""BlockPool: the null block, allocation, freeing order, the prefix cache."""

import pytest

from tests.v1.core.utils import free_block_ids, make_request
from vllm.utils.hashing import sha256
from vllm.v1.core.block_pool import BlockHashToBlockMap, BlockPool
from vllm.v1.core.kv_cache_utils import (
    BlockHash,
    KVCacheBlock,
    init_none_hash,
    make_block_hash_with_group_id,
)


@pytest.fixture(autouse=True)
def _init_none_hash():
    init_none_hash(sha256)


def test_null_block_is_reserved():
    pool = BlockPool(num_gpu_blocks=5, enable_caching=True, hash_block_size=4)
    assert pool.null_block is pool.blocks[0] and pool.null_block.is_null
    assert pool.get_num_free_blocks() == 4
    assert free_block_ids(pool) == [1, 2, 3, 4]
    blocks = pool.get_new_blocks(4)
    assert [b.block_id for b in blocks] == [1, 2, 3, 4]
    assert all(b.ref_cnt == 1 for b in blocks)
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)
    # Freeing (or touching) the null block never puts it in the free queue.
    pool.touch([pool.null_block])
    pool.free_blocks([pool.null_block, *blocks])
    assert free_block_ids(pool) == [1, 2, 3, 4]
    pool.check_integrity()


def test_free_blocks_order():
    pool = BlockPool(num_gpu_blocks=7, enable_caching=True, hash_block_size=4)
    req = make_request("0", list(range(8)), 4, sha256)  # two full blocks
    blocks = pool.get_new_blocks(4)  # ids 1..4
    pool.cache_full_blocks(req, blocks, 0, 2, 4, kv_cache_group_id=0)
    assert free_block_ids(pool) == [5, 6]
    # Freed tail first: unhashed 4, 3 to the front (in that order), hashed
    # 2, 1 to the back.
    pool.free_blocks(reversed(blocks))
    assert free_block_ids(pool) == [4, 3, 5, 6, 2, 1]
    # The next allocation reuses unhashed blocks and keeps the cached ones.
    assert [b.block_id for b in pool.get_new_blocks(2)] == [4, 3]
    assert pool.get_cached_block(req.block_hashes[0], [0]) == [pool.blocks[1]]
    pool.check_integrity()


def test_free_blocks_with_caching_disabled_reuses_most_recent_first():
    pool = BlockPool(num_gpu_blocks=5, enable_caching=False, hash_block_size=4)
    blocks = pool.get_new_blocks(2)
    pool.free_blocks(reversed(blocks))
    assert free_block_ids(pool) == [2, 1, 3, 4]


def test_shared_block_is_freed_when_last_reference_goes():
    pool = BlockPool(num_gpu_blocks=3, enable_caching=True, hash_block_size=4)
    (block,) = pool.get_new_blocks(1)
    pool.touch([block])  # a second request hits it
    assert block.ref_cnt == 2
    pool.free_blocks([block])
    assert block.ref_cnt == 1 and free_block_ids(pool) == [2]
    pool.free_blocks([block])
    assert free_block_ids(pool) == [1, 2]
    with pytest.raises(AssertionError):
        pool.free_blocks([block])  # freed more often than taken


def test_touch_pulls_hits_out_of_the_free_queue():
    pool = BlockPool(num_gpu_blocks=5, enable_caching=True, hash_block_size=4)
    req = make_request("0", list(range(8)), 4, sha256)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, blocks, 0, 2, 4, kv_cache_group_id=0)
    pool.free_blocks(reversed(blocks))
    assert free_block_ids(pool) == [3, 4, 2, 1]
    pool.touch([pool.blocks[2]])
    assert free_block_ids(pool) == [3, 4, 1]
    assert pool.blocks[2].ref_cnt == 1
    pool.check_integrity()


def test_get_new_blocks_evicts_stale_hashes():
    pool = BlockPool(num_gpu_blocks=3, enable_caching=True, hash_block_size=4)
    req = make_request("0", list(range(8)), 4, sha256)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, blocks, 0, 2, 4, kv_cache_group_id=0)
    assert len(pool.cached_block_hash_to_block) == 2
    pool.free_blocks(reversed(blocks))
    # Free but still cached: a later request can hit them.
    assert pool.get_cached_block(req.block_hashes[1], [0]) == [pool.blocks[2]]
    (reused,) = pool.get_new_blocks(1)
    assert reused.block_id == 2 and reused.block_hash is None
    assert pool.get_cached_block(req.block_hashes[1], [0]) is None
    assert pool.get_cached_block(req.block_hashes[0], [0]) == [pool.blocks[1]]
    assert len(pool.cached_block_hash_to_block) == 1


def test_cache_full_blocks_incrementally_and_per_group():
    pool = BlockPool(num_gpu_blocks=10, enable_caching=True, hash_block_size=4)
    req = make_request("0", list(range(14)), 4, sha256)  # 3 full blocks + 2
    assert len(req.block_hashes) == 3
    group0 = [KVCacheBlock(block_id=i) for i in range(1, 3)]
    pool.cache_full_blocks(req, group0, 0, 2, 4, kv_cache_group_id=0)
    assert len(pool.cached_block_hash_to_block) == 2
    group0.append(KVCacheBlock(block_id=3))
    pool.cache_full_blocks(req, group0, 2, 3, 4, kv_cache_group_id=0)
    assert len(pool.cached_block_hash_to_block) == 3
    group1 = [KVCacheBlock(block_id=i) for i in range(4, 6)]
    pool.cache_full_blocks(req, group1, 0, 2, 4, kv_cache_group_id=1)
    assert len(pool.cached_block_hash_to_block) == 5
    # A block hits only if it is cached in every group asked for.
    assert pool.get_cached_block(req.block_hashes[1], [0, 1]) == [group0[1], group1[1]]
    assert pool.get_cached_block(req.block_hashes[2], [0]) == [group0[2]]
    assert pool.get_cached_block(req.block_hashes[2], [0, 1]) is None


def test_cache_full_blocks_skips_null_blocks():
    pool = BlockPool(num_gpu_blocks=8, enable_caching=True, hash_block_size=1)
    req = make_request("0", [10, 11, 12, 13], 1, sha256)
    new_blocks = pool.get_new_blocks(3)
    blocks = [new_blocks[0], pool.null_block, *new_blocks[1:]]
    pool.cache_full_blocks(req, blocks, 0, 4, 1, kv_cache_group_id=0)
    assert pool.null_block.block_hash is None
    assert len(pool.cached_block_hash_to_block) == 3
    assert pool.get_cached_block(req.block_hashes[1], [0]) is None
    assert pool.get_cached_block(req.block_hashes[3], [0]) == [new_blocks[2]]


def test_block_hash_to_block_map_keeps_duplicates():
    pool = BlockPool(num_gpu_blocks=4, enable_caching=True, hash_block_size=16)
    hash0 = make_block_hash_with_group_id(BlockHash(b"10"), 1000)
    hash1 = make_block_hash_with_group_id(BlockHash(b"20"), 2000)
    hash2 = make_block_hash_with_group_id(BlockHash(b"30"), 3000)
    block0, block1, block2, block3 = pool.blocks
    # block3 holds the same contents as block0.
    for block, key in zip(pool.blocks, [hash0, hash1, hash2, hash0]):
        block.block_hash = key
        pool.cached_block_hash_to_block.insert(key, block)
    cache = pool.cached_block_hash_to_block._cache
    assert cache == {hash0: {0: block0, 3: block3}, hash1: block1, hash2: block2}

    assert pool._maybe_evict_cached_block(block1)
    assert cache == {hash0: {0: block0, 3: block3}, hash2: block2}
    # hash0 stays cached: block3 still carries it.
    assert pool._maybe_evict_cached_block(block0)
    assert cache == {hash0: {3: block3}, hash2: block2}
    assert pool._maybe_evict_cached_block(block2)
    assert pool._maybe_evict_cached_block(block3)
    assert cache == {} and block3.block_hash is None
    assert not pool._maybe_evict_cached_block(block3)


def test_block_hash_to_block_map_pop_wrong_id():
    cache = BlockHashToBlockMap()
    key = make_block_hash_with_group_id(BlockHash(b"x"), 0)
    block = KVCacheBlock(block_id=5)
    cache.insert(key, block)
    assert cache.pop(key, 6) is None and cache.get_one_block(key) is block
    assert cache.pop(key, 5) is block and len(cache) == 0


def test_reset_prefix_cache_and_usage():
    pool = BlockPool(num_gpu_blocks=5, enable_caching=True, hash_block_size=4)
    req = make_request("0", list(range(8)), 4, sha256)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, blocks, 0, 2, 4, kv_cache_group_id=0)
    assert pool.get_usage() == pytest.approx(0.5)
    assert not pool.reset_prefix_cache()
    pool.free_blocks(reversed(blocks))
    assert pool.get_usage() == 0.0
    assert pool.reset_prefix_cache()
    assert len(pool.cached_block_hash_to_block) == 0
    assert all(block.block_hash is None for block in pool.blocks)
    assert pool.take_events() == []


def test_check_integrity_detects_corruption():
    pool = BlockPool(num_gpu_blocks=5, enable_caching=True, hash_block_size=4)
    blocks = pool.get_new_blocks(2)
    pool.check_integrity()
    blocks[0].ref_cnt = 0  # leaked: neither used nor free
    with pytest.raises(AssertionError, match="free"):
        pool.check_integrity()
    blocks[0].ref_cnt = 1
    pool.free_block_queue.num_free_blocks += 1
    with pytest.raises(AssertionError, match="num_free_blocks"):
        pool.check_integrity()


def test_kv_cache_events_record_store_evict_and_clear():
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

    pool = BlockPool(
        num_gpu_blocks=4, enable_caching=True, hash_block_size=4, enable_kv_cache_events=True
    )
    req = make_request("0", list(range(10)), 4, sha256)  # two full blocks
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(req, blocks, 0, 1, 4, kv_cache_group_id=0)
    pool.cache_full_blocks(req, blocks, 1, 2, 4, kv_cache_group_id=0)
    first, second = pool.take_events()
    hashes = [maybe_convert_block_hash(h) for h in req.block_hashes]
    assert isinstance(first, BlockStored) and first.parent_block_hash is None
    assert first.block_hashes == hashes[:1] and first.token_ids == [0, 1, 2, 3]
    # The second store chains on the first block's hash.
    assert second.parent_block_hash == hashes[0] and second.block_hashes == hashes[1:2]
    assert second.token_ids == [4, 5, 6, 7] and second.group_idx == 0
    assert pool.take_events() == []  # taken once
    # Reusing a cached block for someone else evicts it: BlockRemoved.
    pool.free_blocks(reversed(blocks))  # unhashed block 3 first, then 2, 1
    pool.get_new_blocks(2)
    (removed,) = pool.take_events()
    assert isinstance(removed, BlockRemoved) and removed.block_hashes == hashes[1:2]
    pool.free_blocks(pool.blocks[2:4])
    assert pool.reset_prefix_cache()
    assert isinstance(pool.take_events()[-1], AllBlocksCleared)


def test_no_events_recorded_unless_enabled():
    pool = BlockPool(num_gpu_blocks=4, enable_caching=True, hash_block_size=4)
    req = make_request("0", list(range(8)), 4, sha256)
    pool.cache_full_blocks(req, pool.get_new_blocks(2), 0, 2, 4, kv_cache_group_id=0)
    assert pool.take_events() == []
