"""KVCacheManager with prefix caching: exact block ids and free-queue order."""

from collections.abc import Callable

import pytest
import torch

import vllm.v1.core.kv_cache_utils as kv_cache_utils
from tests.v1.core.utils import (
    free_block_ids,
    make_kv_cache_config,
    make_request,
    make_sliding_window_kv_cache_config,
)
from vllm.utils.hashing import sha256, sha256_cbor
from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
from vllm.v1.core.kv_cache_utils import (
    get_block_hash,
    get_group_id,
    hash_block_tokens,
    init_none_hash,
)
from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager


@pytest.fixture(autouse=True)
def _init_none_hash(request):
    hash_fn = request.getfixturevalue("hash_fn") if "hash_fn" in request.fixturenames else sha256
    init_none_hash(hash_fn)


def make_manager(block_size: int, num_blocks: int, **kwargs) -> KVCacheManager:
    kwargs.setdefault("enable_caching", True)
    return KVCacheManager(
        make_kv_cache_config(block_size, num_blocks),
        max_model_len=8192,
        hash_block_size=block_size,
        **kwargs,
    )


def schedule(manager: KVCacheManager, request, num_new_tokens: int | None = None):
    """Look the request up and allocate its prompt, as the scheduler does."""
    computed_blocks, num_computed_tokens, boundary = manager.get_computed_blocks(request)
    assert boundary == 0
    if num_new_tokens is None:
        num_new_tokens = request.num_tokens - num_computed_tokens
    new_blocks = manager.allocate_slots(
        request, num_new_tokens, num_computed_tokens, computed_blocks
    )
    return computed_blocks, num_computed_tokens, new_blocks


@pytest.mark.parametrize("hash_fn", [sha256, sha256_cbor])
def test_prefill(hash_fn: Callable):
    manager = make_manager(16, 11)
    common_token_ids = [i for i in range(3) for _ in range(16)]  # 3 full blocks

    # Full miss: 3 full blocks + 7 tokens.
    all_token_ids = common_token_ids + [3] * 7
    req0 = make_request("0", all_token_ids, 16, hash_fn)
    computed, num_computed, blocks = schedule(manager, req0)
    assert len(req0.block_hashes) == 3
    assert not computed.blocks[0] and num_computed == 0
    assert blocks is not None and blocks.get_block_ids() == ([1, 2, 3, 4],)

    # The full blocks carry the chained hash and group 0; the partial one none.
    parent_hash = None
    for block_id in (1, 2, 3):
        tokens = all_token_ids[(block_id - 1) * 16 : block_id * 16]
        parent_hash = hash_block_tokens(hash_fn, parent_hash, tokens)
        block = manager.block_pool.blocks[block_id]
        assert block.block_hash is not None
        assert get_block_hash(block.block_hash) == parent_hash
        assert get_group_id(block.block_hash) == 0
        assert block.ref_cnt == 1
    assert manager.block_pool.blocks[4].block_hash is None
    assert manager.block_pool.blocks[4].ref_cnt == 1

    # Hit on the common prefix while req0 still holds it.
    req1 = make_request("1", common_token_ids + [3] * 5, 16, hash_fn)
    computed, num_computed, blocks = schedule(manager, req1)
    assert computed.get_block_ids() == ([1, 2, 3],) and num_computed == 48
    assert blocks is not None and blocks.get_block_ids() == ([5],)
    assert all(block.ref_cnt == 2 for block in computed.blocks[0])
    assert manager.block_pool.get_num_free_blocks() == 5

    manager.free(req0)
    manager.free(req1)
    # Front: unhashed partial blocks (req1's 5, then req0's 4), prepended for
    # immediate reuse; then never-used 6..10; then the shared prefix, tail first.
    assert free_block_ids(manager) == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    manager.block_pool.check_integrity()

    # Hit on the common prefix after it was freed: the hits leave the queue.
    req2 = make_request("2", common_token_ids + [3] * 6, 16, hash_fn)
    computed, num_computed, blocks = schedule(manager, req2)
    assert computed.get_block_ids() == ([1, 2, 3],) and num_computed == 48
    assert blocks is not None and blocks.get_block_ids() == ([5],)
    assert free_block_ids(manager) == [4, 6, 7, 8, 9, 10]
    manager.free(req2)

    # Miss that needs every block: the allocation order is the eviction order.
    req3 = make_request("3", [99] * (16 * 10), 16, hash_fn)
    computed, num_computed, blocks = schedule(manager, req3)
    assert not computed.blocks[0] and num_computed == 0
    assert blocks is not None
    assert blocks.get_block_ids() == ([5, 4, 6, 7, 8, 9, 10, 3, 2, 1],)
    queue = manager.block_pool.free_block_queue
    assert queue.num_free_blocks == 0
    assert queue.fake_free_list_head.next_free_block is queue.fake_free_list_tail
    assert queue.fake_free_list_tail.prev_free_block is queue.fake_free_list_head
    # All 10 blocks are full and cached under req3's hashes; the old prefix
    # was evicted from the cache.
    assert len(manager.block_pool.cached_block_hash_to_block) == 10
    req4 = make_request("4", common_token_ids + [3] * 6, 16, hash_fn)
    assert manager.get_computed_blocks(req4)[1] == 0
    manager.block_pool.check_integrity()


def test_prefill_plp():
    """Prompt-logprobs requests never hit, but their blocks are cached."""
    manager = make_manager(16, 11)
    common_token_ids = [i for i in range(3) for _ in range(16)]
    req0 = make_request("0", common_token_ids + [3] * 7, 16, sha256, prompt_logprobs=5)
    computed, num_computed, blocks = schedule(manager, req0)
    assert num_computed == 0
    assert blocks is not None and blocks.get_block_ids() == ([1, 2, 3, 4],)
    req0_hashes = [block.block_hash for block in blocks.blocks[0]]

    req1 = make_request("1", common_token_ids + [3] * 5, 16, sha256)
    computed, num_computed, blocks = schedule(manager, req1)
    assert computed.get_block_ids() == ([1, 2, 3],) and num_computed == 48
    manager.free(req0)
    manager.free(req1)
    assert free_block_ids(manager) == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]

    # Same prefix, prompt logprobs again: no hit; equal blocks are duplicated.
    req2 = make_request("2", common_token_ids + [3] * 6, 16, sha256, prompt_logprobs=5)
    computed, num_computed, blocks = schedule(manager, req2)
    assert not computed.blocks[0] and num_computed == 0
    assert blocks is not None and blocks.get_block_ids() == ([5, 4, 6, 7],)
    assert [block.block_hash for block in blocks.blocks[0]] == req0_hashes
    assert all(block.ref_cnt == 1 for block in blocks.blocks[0])
    # Blocks 1-3 and 5, 4, 6 now share hashes: both copies stay findable.
    key = manager.block_pool.blocks[1].block_hash
    assert set(manager.block_pool.cached_block_hash_to_block._cache[key]) == {1, 5}
    manager.free(req2)
    manager.block_pool.check_integrity()


def test_decode():
    manager = make_manager(16, 11)
    common_token_ids = [i for i in range(3) for _ in range(16)]
    req0 = make_request("0", common_token_ids + [3] * 7, 16, sha256)
    _, _, blocks = schedule(manager, req0)
    assert blocks is not None and blocks.get_block_ids() == ([1, 2, 3, 4],)
    req_blocks = manager.coordinator.single_type_managers[0].req_to_blocks["0"]

    # 4 decode tokens fit in the partial block: nothing new, nothing cached.
    req0.num_computed_tokens = 55
    for _ in range(4):
        req0.append_output_token_ids(8)
    new_blocks = manager.allocate_slots(req0, 4)
    assert new_blocks is not None and len(new_blocks.blocks[0]) == 0
    assert req_blocks[-1].block_hash is None

    # 19 more tokens: fill block 4 (9 tokens) and 10 into a new block. Block 4
    # is now full and gets cached.
    req0.num_computed_tokens = 59
    for _ in range(9 + 10):
        req0.append_output_token_ids(7)
    new_blocks = manager.allocate_slots(req0, 19)
    assert new_blocks is not None and new_blocks.get_block_ids() == ([5],)
    assert req_blocks[-2].block_hash is not None
    assert get_block_hash(req_blocks[-2].block_hash) == req0.block_hashes[3]
    assert req_blocks[-1].block_hash is None


def test_evict():
    manager = make_manager(16, 11)
    last_token_id = 5 * 16 + 7
    req0 = make_request("0", list(range(last_token_id)), 16, sha256)
    _, _, blocks = schedule(manager, req0)
    assert blocks is not None and len(blocks.blocks[0]) == 6  # 5 full + 1 partial

    req1 = make_request("1", list(range(last_token_id, last_token_id + 3 * 16)), 16, sha256)
    _, _, blocks = schedule(manager, req1)
    assert blocks is not None and len(blocks.blocks[0]) == 3
    assert manager.block_pool.get_num_free_blocks() == 1  # 10 - (6 + 3)

    manager.free(req0)
    # The partial block (no hash) goes to the front, the rest to the back (LRU).
    assert free_block_ids(manager) == [6, 10, 5, 4, 3, 2, 1]
    manager.free(req1)
    assert free_block_ids(manager) == [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]

    # Hit on the first 2 blocks; the new block comes from the front.
    req2 = make_request("2", list(range(2 * 16 + 3)), 16, sha256)
    computed, num_computed, blocks = schedule(manager, req2)
    assert computed.get_block_ids() == ([1, 2],) and num_computed == 32
    assert blocks is not None and blocks.get_block_ids() == ([6],)
    assert manager.block_pool.get_num_free_blocks() == 7
    manager.block_pool.check_integrity()


def test_hash_block_correct_reuse():
    """A cached block handed out again loses its old hash."""
    manager = make_manager(16, 2)
    req = make_request("0", list(range(16)), 16, sha256)
    _, _, blocks = schedule(manager, req)
    assert blocks is not None and len(blocks.blocks[0]) == 1
    assert blocks.blocks[0][0].block_hash is not None
    manager.free(req)

    req = make_request("1", list(range(15)), 16, sha256)
    _, _, blocks = schedule(manager, req)
    assert blocks is not None and len(blocks.blocks[0]) == 1
    assert manager.block_pool.blocks[blocks.blocks[0][0].block_id].block_hash is None
    assert len(manager.block_pool.cached_block_hash_to_block) == 0


def test_computed_blocks_not_evicted():
    """Allocating next to a hit evicts another cached block, never the hit."""
    manager = make_manager(16, 3)
    req0 = make_request("0", list(range(16)), 16, sha256)
    _, _, blocks = schedule(manager, req0)
    assert blocks is not None and blocks.get_block_ids() == ([1],)
    req1 = make_request("1", list(range(16, 32)), 16, sha256)
    _, _, blocks = schedule(manager, req1)
    assert blocks is not None and blocks.get_block_ids() == ([2],)
    manager.free(req0)
    manager.free(req1)

    req2 = make_request("2", list(range(32)), 16, sha256)
    computed, num_computed, blocks = schedule(manager, req2)
    assert computed.get_block_ids() == ([1],) and num_computed == 16
    assert blocks is not None and blocks.get_block_ids() == ([2],)


def test_basic_prefix_caching_disabled():
    manager = make_manager(4, 5, enable_caching=False)
    req1 = make_request("1", list(range(10)), 4, sha256)  # 2 blocks and a bit
    computed, num_computed, blocks = schedule(manager, req1)
    assert not computed.blocks[0] and num_computed == 0
    assert blocks is not None and len(blocks.blocks[0]) == 3
    manager.free(req1)

    # Same prefix, no caching: no hit, nothing ever hashed in the pool.
    req2 = make_request("2", list(range(16)), 4, sha256)
    computed, num_computed, blocks = schedule(manager, req2)
    assert not computed.blocks[0] and num_computed == 0
    assert blocks is not None and len(blocks.blocks[0]) == 4
    assert all(block.block_hash is None for block in manager.block_pool.blocks)

    # The pool is exhausted.
    req3 = make_request("3", list(range(4)), 4, sha256)
    assert manager.allocate_slots(req3, 4) is None


def test_cache_hit_capped_at_num_tokens_minus_one():
    """A prompt that is fully cached still recomputes its last block."""
    manager = make_manager(16, 11)
    req0 = make_request("0", list(range(48)), 16, sha256)
    _, num_computed, blocks = schedule(manager, req0)
    assert num_computed == 0 and blocks is not None
    assert len(manager.block_pool.cached_block_hash_to_block) == 3
    manager.free(req0)

    # 48 tokens, all cached: at most 47 may hit, so only 2 whole blocks do.
    req1 = make_request("1", list(range(48)), 16, sha256)
    computed, num_computed, blocks = schedule(manager, req1)
    assert computed.get_block_ids() == ([1, 2],) and num_computed == 32
    assert blocks is not None and len(blocks.blocks[0]) == 1
    # One token more and all three blocks hit.
    req2 = make_request("2", list(range(49)), 16, sha256)
    computed, num_computed, _ = manager.get_computed_blocks(req2)
    assert computed.get_block_ids() == ([1, 2, 3],) and num_computed == 48


def test_cache_key_salting():
    manager = make_manager(16, 11)
    common_token_ids = [i for i in range(3) for _ in range(16)]
    token_ids = common_token_ids + [3] * 11
    req0 = make_request("0", token_ids, 16, sha256, cache_salt="salt1")
    # The salt is an extra key of the first block only; the chain carries it.
    hashes = req0.block_hashes
    assert hashes[0] == sha256((kv_cache_utils.NONE_HASH, tuple(token_ids[:16]), ("salt1",)))
    assert hashes[1] == sha256((hashes[0], tuple(token_ids[16:32]), None))
    schedule(manager, req0)

    req1 = make_request("1", common_token_ids + [4] * 11, 16, sha256, cache_salt="salt1")
    _, num_computed, _ = manager.get_computed_blocks(req1)
    assert num_computed == 48
    for salt in ("salt2", None):
        req2 = make_request("2", common_token_ids + [4] * 11, 16, sha256, cache_salt=salt)
        _, num_computed, _ = manager.get_computed_blocks(req2)
        assert num_computed == 0


def test_prompt_embeds_are_part_of_the_key():
    manager = make_manager(4, 11)
    embeds = torch.arange(8 * 2, dtype=torch.float32).reshape(8, 2)
    req0 = make_request("0", [0] * 8, 4, sha256, prompt_embeds=embeds)
    schedule(manager, req0)
    same = make_request("1", [0] * 9, 4, sha256, prompt_embeds=torch.cat([embeds, embeds[:1]]))
    assert manager.get_computed_blocks(same)[1] == 8
    changed = embeds.clone()
    changed[5, 1] += 1.0  # second block differs
    other = make_request("2", [0] * 9, 4, sha256, prompt_embeds=torch.cat([changed, embeds[:1]]))
    assert manager.get_computed_blocks(other)[1] == 4


def test_prefill_not_enough_free_blocks_with_computed_blocks():
    """A failed allocation leaves the hits' reference counts untouched."""
    manager = make_manager(16, 11)
    common_token_ids = [i for i in range(3) for _ in range(16)]
    req0 = make_request("0", common_token_ids, 16, sha256)
    schedule(manager, req0)
    block_part0 = manager.coordinator.single_type_managers[0].req_to_blocks["0"]

    req1 = make_request("1", common_token_ids * 2, 16, sha256)
    computed, num_computed, _ = schedule(manager, req1)
    assert computed.blocks[0] == block_part0 and num_computed == 48
    block_part1 = list(manager.coordinator.single_type_managers[0].req_to_blocks["1"])
    manager.free(req1)
    assert {block.ref_cnt for block in block_part1[:3]} == {1}
    assert {block.ref_cnt for block in block_part1[3:]} == {0}

    req2 = make_request("2", [7] * 32, 16, sha256)
    schedule(manager, req2)
    assert manager.block_pool.get_num_free_blocks() == 5

    # req3 hits 6 blocks (3 of them free) and needs 3 more: 6 > 5 free.
    req3 = make_request("3", common_token_ids * 3, 16, sha256)
    computed, num_computed, _ = manager.get_computed_blocks(req3)
    assert list(computed.blocks[0]) == block_part1 and num_computed == 96
    assert manager.allocate_slots(req3, 48, num_computed, computed) is None
    assert {block.ref_cnt for block in block_part1[:3]} == {1}
    assert {block.ref_cnt for block in block_part1[3:]} == {0}
    manager.block_pool.check_integrity()


def test_reset_prefix_cache():
    manager = make_manager(16, 11)
    full_block_token_ids = [i for i in range(3) for _ in range(16)]
    req0 = make_request("0", full_block_token_ids + [3] * 7, 16, sha256)
    blocks = manager.allocate_slots(req0, 55)
    assert blocks is not None and blocks.get_block_ids() == ([1, 2, 3, 4],)
    req1 = make_request("1", full_block_token_ids + [4] * 7, 16, sha256)
    _, _, blocks = schedule(manager, req1)
    assert blocks is not None and blocks.get_block_ids() == ([5],)

    # Blocks still held: the reset is refused.
    assert not manager.reset_prefix_cache()
    assert manager.block_pool.cached_block_hash_to_block
    manager.free(req0)
    manager.free(req1)
    assert manager.reset_prefix_cache()
    assert not manager.block_pool.cached_block_hash_to_block
    assert all(block.block_hash is None for block in manager.block_pool.blocks)


def test_prefix_cache_stats():
    manager = make_manager(16, 11, log_stats=True)
    req0 = make_request("0", list(range(40)), 16, sha256)
    schedule(manager, req0)
    req1 = make_request("1", list(range(40)), 16, sha256)
    schedule(manager, req1)
    stats = manager.make_prefix_cache_stats()
    assert stats is not None
    assert (stats.requests, stats.queries, stats.hits) == (2, 80, 32)
    assert not stats.reset
    # Counters restart after each report; a reset is reported.
    manager.free(req0)
    manager.free(req1)
    assert manager.reset_prefix_cache()
    stats = manager.make_prefix_cache_stats()
    assert stats is not None and stats.reset and stats.requests == 0

    disabled = make_manager(16, 11)
    assert disabled.prefix_cache_stats is None
    schedule(disabled, make_request("0", list(range(16)), 16, sha256))
    assert disabled.make_prefix_cache_stats() is None


def test_get_num_common_prefix_blocks_and_usage():
    manager = make_manager(16, 11)
    common_token_ids = list(range(32))
    req0 = make_request("0", common_token_ids + [100] * 5, 16, sha256)
    req1 = make_request("1", common_token_ids + [200] * 5, 16, sha256)
    schedule(manager, req0)
    schedule(manager, req1)
    assert manager.get_num_common_prefix_blocks("0") == [2]
    assert manager.get_block_ids("1") == ([1, 2, 4],)
    assert manager.usage == pytest.approx(4 / 10)
    req2 = make_request("2", [300] * 20, 16, sha256)
    schedule(manager, req2)
    assert manager.get_num_common_prefix_blocks("0") == [0]
    for req in (req0, req1, req2):
        manager.free(req)
    assert manager.usage == 0.0
    assert manager.get_blocks("0").blocks == ((),)


def test_lookahead_slots_are_not_cached():
    manager = make_manager(4, 11)
    req = make_request("0", list(range(6)), 4, sha256)
    blocks = manager.allocate_slots(req, 6, num_lookahead_tokens=4)
    # 6 + 4 lookahead slots need 3 blocks; only the one full block is cached.
    assert blocks is not None and blocks.get_block_ids() == ([1, 2, 3],)
    assert [b.block_hash is not None for b in blocks.blocks[0]] == [True, False, False]


def test_allocate_slots_rejects_zero_tokens():
    manager = make_manager(16, 11)
    req = make_request("0", list(range(5)), 16, sha256)
    with pytest.raises(ValueError):
        manager.allocate_slots(req, 0)


def test_kv_cache_blocks_helpers():
    manager = make_manager(16, 11)
    req = make_request("0", list(range(20)), 16, sha256)
    _, _, blocks = schedule(manager, req)
    assert blocks is not None
    assert blocks.get_unhashed_block_ids() == [2]
    both = blocks + KVCacheBlocks(([manager.block_pool.blocks[7]],))
    assert both.get_block_ids() == ([1, 2, 7],)
    assert blocks.new_empty().get_block_ids(allow_none=True) is None
    assert manager.empty_kv_cache_blocks.get_block_ids() == ([],)


def _make_sliding_window_manager(num_blocks: int) -> KVCacheManager:
    # Block size 4, window 8 tokens: a hit needs ceil((8 - 1) / 4) = 2 blocks.
    return KVCacheManager(
        make_sliding_window_kv_cache_config(4, num_blocks, sliding_window=8),
        max_model_len=8192,
        hash_block_size=4,
    )


def test_sliding_window_hit_needs_only_the_window():
    manager = _make_sliding_window_manager(20)
    assert isinstance(manager.coordinator.single_type_managers[0], SlidingWindowManager)
    req0 = make_request("0", list(range(26)), 4, sha256)  # 6 full blocks + 2
    _, _, blocks = schedule(manager, req0)
    assert blocks is not None and blocks.get_block_ids() == ([1, 2, 3, 4, 5, 6, 7],)
    manager.free(req0)

    # Evict the cache entries of blocks 1 and 2 (the head of the prompt): a
    # sliding-window hit only needs the last 2 blocks before the new token.
    pool = manager.block_pool
    for block_id in (1, 2):
        assert pool._maybe_evict_cached_block(pool.blocks[block_id])
    req1 = make_request("1", list(range(26)), 4, sha256)
    computed, num_computed, _ = manager.get_computed_blocks(req1)
    assert num_computed == 24
    assert computed.get_block_ids() == ([0, 0, 0, 0, 5, 6],)

    # A miss inside the window cuts the hit back to the last full run.
    assert pool._maybe_evict_cached_block(pool.blocks[5])
    req2 = make_request("2", list(range(26)), 4, sha256)
    computed, num_computed, _ = manager.get_computed_blocks(req2)
    assert num_computed == 16
    assert computed.get_block_ids() == ([0, 0, 3, 4],)


def test_sliding_window_frees_blocks_out_of_the_window():
    manager = _make_sliding_window_manager(20)
    req = make_request("0", list(range(16)), 4, sha256)
    _, _, blocks = schedule(manager, req)
    assert blocks is not None and blocks.get_block_ids() == ([1, 2, 3, 4],)
    req.num_computed_tokens = 16
    req.append_output_token_ids(16)
    # The next token (position 16) reads positions 9..16: blocks 0 and 1 of
    # the request (tokens 0..7) are out of the window and become null.
    new_blocks = manager.allocate_slots(req, 1)
    assert new_blocks is not None and new_blocks.get_block_ids() == ([5],)
    assert manager.get_block_ids("0") == ([0, 0, 3, 4, 5],)
    # Freed blocks keep their hash and go to the back of the queue (LRU),
    # later blocks first, as when a request is freed.
    assert free_block_ids(manager)[-2:] == [2, 1]
    assert manager.block_pool.blocks[1].block_hash is not None
    manager.free(req)
    manager.block_pool.check_integrity()


def test_sliding_window_hit_skips_blocks_out_of_the_window():
    manager = _make_sliding_window_manager(20)
    req0 = make_request("0", list(range(26)), 4, sha256)
    schedule(manager, req0)
    manager.free(req0)
    req1 = make_request("1", list(range(26)), 4, sha256)
    computed, num_computed, blocks = schedule(manager, req1)
    assert num_computed == 24
    # Hits before the window of token 24 (positions 17..24) are not taken:
    # only blocks 5 and 6 are referenced, the rest of the table is null.
    assert manager.get_block_ids("1") == ([0, 0, 0, 0, 5, 6, 7],)
    assert blocks is not None and blocks.get_block_ids() == ([7],)
    assert [manager.block_pool.blocks[i].ref_cnt for i in (1, 2, 3, 4)] == [0] * 4
    manager.block_pool.check_integrity()
