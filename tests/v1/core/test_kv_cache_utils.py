"""kv_cache_utils: the free queue, block hashing, and KV cache planning."""

import pytest
import torch

import vllm.v1.core.kv_cache_utils as kv_cache_utils
from tests.v1.core.utils import make_request
from vllm.utils.hashing import get_hash_fn_by_name, sha256, sha256_cbor, xxhash, xxhash_cbor
from vllm.v1.core.kv_cache_utils import (
    BlockHash,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    generate_block_hash_extra_keys,
    get_block_hash,
    get_group_id,
    get_request_block_hasher,
    hash_block_tokens,
    init_none_hash,
    make_block_hash_with_group_id,
)


@pytest.fixture(autouse=True)
def _init_none_hash():
    init_none_hash(sha256)


def queue_ids(queue: FreeKVCacheBlockQueue) -> list[int]:
    return [block.block_id for block in queue.get_all_free_blocks()]


def test_free_kv_cache_block_queue_initialization():
    blocks = [KVCacheBlock(block_id=i) for i in range(3)]
    queue = FreeKVCacheBlockQueue(blocks)
    assert queue.num_free_blocks == 3 and queue_ids(queue) == [0, 1, 2]
    assert queue.fake_free_list_head.next_free_block is blocks[0]
    assert blocks[0].prev_free_block is queue.fake_free_list_head
    assert blocks[2].next_free_block is queue.fake_free_list_tail
    assert queue.fake_free_list_tail.prev_free_block is blocks[2]

    empty = FreeKVCacheBlockQueue([])
    assert empty.num_free_blocks == 0 and empty.get_all_free_blocks() == []
    assert empty.fake_free_list_head.next_free_block is empty.fake_free_list_tail
    with pytest.raises(ValueError):
        empty.popleft()


def test_free_kv_cache_block_queue_operations():
    blocks = [KVCacheBlock(block_id=i) for i in range(6)]
    queue = FreeKVCacheBlockQueue(blocks)

    first = queue.popleft()
    assert first is blocks[0] and first.prev_free_block is first.next_free_block is None
    queue.remove(blocks[3])  # from the middle
    assert queue_ids(queue) == [1, 2, 4, 5] and queue.num_free_blocks == 4
    queue.append(blocks[3])
    assert queue_ids(queue) == [1, 2, 4, 5, 3]
    popped = queue.popleft_n(3)
    assert [b.block_id for b in popped] == [1, 2, 4]
    assert all(b.prev_free_block is None and b.next_free_block is None for b in popped)
    assert queue_ids(queue) == [5, 3] and queue.num_free_blocks == 2
    queue.append_n([popped[2], popped[0]])
    assert queue_ids(queue) == [5, 3, 4, 1]
    queue.prepend_n([blocks[0], popped[1]])
    assert queue_ids(queue) == [0, 2, 5, 3, 4, 1] and queue.num_free_blocks == 6
    assert queue.popleft_n(0) == []

    # Pop everything: the fake head and tail link up again.
    assert [b.block_id for b in queue.popleft_n(6)] == [0, 2, 5, 3, 4, 1]
    assert queue.num_free_blocks == 0
    assert queue.fake_free_list_head.next_free_block is queue.fake_free_list_tail
    assert queue.fake_free_list_tail.prev_free_block is queue.fake_free_list_head
    queue.prepend_n([blocks[4]])
    assert queue_ids(queue) == [4]
    with pytest.raises(RuntimeError):
        queue.remove(blocks[0])  # not in the list


def test_kv_cache_block_hash_property():
    block = KVCacheBlock(block_id=0)
    assert block.block_hash is None
    key = make_block_hash_with_group_id(BlockHash(b"abc"), 3)
    block.block_hash = key
    assert block.block_hash == key
    with pytest.raises(AssertionError):
        block.block_hash = key  # a block is hashed only once until reset
    block.reset_hash()
    assert block.block_hash is None
    assert "block_id=0" in repr(block)


def test_block_hash_with_group_id_round_trip():
    block_hash = BlockHash(b"\x01\x02hash")
    for group_id in (0, 1, 255, 70_000):
        key = make_block_hash_with_group_id(block_hash, group_id)
        assert key == block_hash + group_id.to_bytes(4, "big")
        assert get_block_hash(key) == block_hash and get_group_id(key) == group_id


@pytest.mark.parametrize("hash_fn", [sha256, sha256_cbor])
def test_none_hash(monkeypatch, hash_fn):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    init_none_hash(hash_fn)
    # Cryptographic hashes: a fixed seed, equal across processes.
    assert hash_fn("vllm-none-hash") == kv_cache_utils.NONE_HASH
    monkeypatch.setenv("PYTHONHASHSEED", "python hash seed")
    init_none_hash(hash_fn)
    assert hash_fn("python hash seed") == kv_cache_utils.NONE_HASH


@pytest.mark.parametrize("hash_fn", [xxhash, xxhash_cbor])
def test_none_hash_is_random_for_xxhash(monkeypatch, hash_fn):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    init_none_hash(hash_fn)
    first = kv_cache_utils.NONE_HASH
    init_none_hash(hash_fn)
    assert first != kv_cache_utils.NONE_HASH
    assert hash_fn("vllm-none-hash") != kv_cache_utils.NONE_HASH


@pytest.mark.parametrize("hash_fn", [sha256, sha256_cbor, xxhash, xxhash_cbor])
def test_hash_block_tokens_chains(hash_fn):
    init_none_hash(hash_fn)
    first = hash_block_tokens(hash_fn, None, [1, 2, 3])
    assert first == hash_fn((kv_cache_utils.NONE_HASH, (1, 2, 3), None))
    second = hash_block_tokens(hash_fn, first, [4, 5, 6], ("key",))
    assert second == hash_fn((first, (4, 5, 6), ("key",)))
    # The same tokens after another parent hash differently.
    assert hash_block_tokens(hash_fn, second, [4, 5, 6]) != hash_block_tokens(
        hash_fn, first, [4, 5, 6]
    )


def test_hash_functions_by_name():
    for name, fn in [
        ("sha256", sha256),
        ("sha256_cbor", sha256_cbor),
        ("xxhash", xxhash),
        ("xxhash_cbor", xxhash_cbor),
    ]:
        assert get_hash_fn_by_name(name) is fn
    assert len(sha256((1, (2, 3), None))) == 32
    assert len(xxhash((1, (2, 3), None))) == 16
    assert sha256_cbor((b"a", (1, 2), None)) == sha256_cbor((b"a", [1, 2], None))
    with pytest.raises(ValueError):
        get_hash_fn_by_name("md5")


@pytest.mark.parametrize("hash_fn", [sha256, sha256_cbor])
def test_request_block_hasher(hash_fn):
    init_none_hash(hash_fn)
    req = make_request("0", list(range(10)), 3, hash_fn)
    # Only full blocks are hashed: 10 tokens -> 3 blocks of 3.
    assert len(req.block_hashes) == 3
    parent = None
    for i, block_hash in enumerate(req.block_hashes):
        parent = hash_block_tokens(hash_fn, parent, list(range(3 * i, 3 * i + 3)))
        assert block_hash == parent
    # Appended tokens complete blocks; the chain continues from the last hash.
    req.append_output_token_ids(10)
    assert len(req.block_hashes) == 3
    req.append_output_token_ids([11, 12, 13])
    assert len(req.block_hashes) == 4
    assert req.block_hashes[3] == hash_block_tokens(hash_fn, parent, [9, 10, 11])
    assert get_request_block_hasher(3, hash_fn)(req) == []


def test_generate_block_hash_extra_keys_cache_salt():
    req = make_request("0", list(range(20)), 4, sha256, cache_salt="salt")
    assert generate_block_hash_extra_keys(req, 0, 4, 0) == (("salt",), 0)
    assert generate_block_hash_extra_keys(req, 4, 8, 0) == (None, 0)
    plain = make_request("1", list(range(20)), 4, sha256)
    assert generate_block_hash_extra_keys(plain, 0, 4, 0) == (None, 0)
    # The salt changes every hash of the chain, not only the first.
    assert all(a != b for a, b in zip(req.block_hashes, plain.block_hashes))


def test_generate_block_hash_extra_keys_prompt_embeds():
    embeds = torch.randn(8, 4)
    req = make_request("0", [0] * 8, 4, sha256, prompt_embeds=embeds)
    keys, _ = generate_block_hash_extra_keys(req, 4, 8, 0)
    assert keys is not None and len(keys) == 1
    other = make_request("1", [0] * 8, 4, sha256, prompt_embeds=embeds + 1)
    assert generate_block_hash_extra_keys(other, 4, 8, 0)[0] != keys
    assert req.block_hashes[1] == hash_block_tokens(sha256, req.block_hashes[0], [0] * 4, keys)


# ---- KV cache planning -------------------------------------------------------


@pytest.fixture(scope="module")
def _model_config():
    from vllm.config import ModelConfig

    return ModelConfig(max_model_len=64, dtype="float32")  # the embedded model


@pytest.fixture
def vllm_config(_model_config):
    from vllm.config import CacheConfig, SchedulerConfig, VllmConfig

    _model_config.max_model_len = 64
    return VllmConfig(
        model_config=_model_config,
        cache_config=CacheConfig(block_size=16),
        scheduler_config=SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4),
    )


def full_spec(head_size: int = 64, sliding_window: int | None = None):
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return FullAttentionSpec(
        block_size=16,
        num_kv_heads=2,
        head_size=head_size,
        dtype=torch.float32,
        sliding_window=sliding_window,
    )


def sliding_spec(sliding_window: int = 32):
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    return SlidingWindowSpec(
        block_size=16,
        num_kv_heads=2,
        head_size=64,
        dtype=torch.float32,
        sliding_window=sliding_window,
    )


# 2 (K and V) * 16 tokens * 2 heads * 64 dims * 4 bytes.
PAGE = 16384


def test_get_kv_cache_configs_uniform(vllm_config):
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec, KVCacheTensor

    specs = {"layer1": full_spec(), "layer2": full_spec()}
    assert specs["layer1"].page_size_bytes == PAGE
    # Memory for 10 blocks per layer, plus a bit that does not make a block.
    (config,) = get_kv_cache_configs(vllm_config, [specs], [PAGE * 2 * 10 + 100])
    assert config.num_blocks == 10
    assert config.kv_cache_tensors == [
        KVCacheTensor(size=PAGE * 10, shared_by=["layer1"]),
        KVCacheTensor(size=PAGE * 10, shared_by=["layer2"]),
    ]
    assert config.kv_cache_groups == [KVCacheGroupSpec(["layer1", "layer2"], full_spec())]

    vllm_config.cache_config.num_gpu_blocks_override = 6
    (config,) = get_kv_cache_configs(vllm_config, [specs], [PAGE * 2 * 10])
    assert config.num_blocks == 6
    assert config.kv_cache_tensors[0].size == PAGE * 6


def test_get_kv_cache_configs_workers_agree(vllm_config):
    from vllm.v1.core.kv_cache_utils import (
        generate_scheduler_kv_cache_config,
        get_kv_cache_configs,
    )

    # Two pipeline stages with one layer each and different free memory: the
    # groups list each worker's own layers; num_blocks is the smaller one.
    configs = get_kv_cache_configs(
        vllm_config,
        [{"layer1": full_spec()}, {"layer2": full_spec()}],
        [PAGE * 12, PAGE * 8],
    )
    assert [c.num_blocks for c in configs] == [8, 8]
    assert [c.kv_cache_groups[0].layer_names for c in configs] == [["layer1"], ["layer2"]]
    # The worker with more memory shrinks its tensor to the 8 blocks used: it
    # allocates by size, so 12 would waste 4 blocks' memory.
    assert [c.kv_cache_tensors[0].size for c in configs] == [PAGE * 8, PAGE * 8]

    scheduler_config = generate_scheduler_kv_cache_config(configs)
    assert scheduler_config == configs[0] and scheduler_config is not configs[0]
    with pytest.raises(ValueError):
        get_kv_cache_configs(
            vllm_config, [{"l": full_spec()}, {"l": full_spec(32)}], [PAGE * 8, PAGE * 8]
        )


def test_scheduler_config_represents_a_uniform_group_by_one_spec():
    from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, UniformTypeKVCacheSpecs

    specs = {"a": full_spec(), "b": full_spec()}
    worker = KVCacheConfig(
        num_blocks=4,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["a", "b"], UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs=specs)
            )
        ],
    )
    (group,) = generate_scheduler_kv_cache_config([worker]).kv_cache_groups
    assert group.kv_cache_spec == full_spec()
    assert isinstance(worker.kv_cache_groups[0].kv_cache_spec, UniformTypeKVCacheSpecs)


def test_check_enough_kv_cache_memory(vllm_config):
    from vllm.v1.core.kv_cache_utils import check_enough_kv_cache_memory, estimate_max_model_len

    specs = {"layer1": full_spec(), "layer2": full_spec()}
    # max_model_len 64 needs 4 blocks in each of the 2 layers: 8 pages.
    check_enough_kv_cache_memory(vllm_config, specs, PAGE * 8)
    assert estimate_max_model_len(vllm_config, specs, PAGE * 7) == 48
    assert vllm_config.model_config.max_model_len == 64  # restored
    with pytest.raises(ValueError, match=r"max seq len \(64\) is larger than .* \(48\)"):
        check_enough_kv_cache_memory(vllm_config, specs, PAGE * 7)
    with pytest.raises(ValueError, match="No available memory for the cache blocks"):
        check_enough_kv_cache_memory(vllm_config, specs, 0)
    # A model without KV cache needs no memory.
    check_enough_kv_cache_memory(vllm_config, {}, 0)


def test_get_kv_cache_configs_attention_free(vllm_config):
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs

    (config,) = get_kv_cache_configs(vllm_config, [{}], [0])
    assert (config.num_blocks, config.kv_cache_tensors, config.kv_cache_groups) == (1, [], [])


def test_get_kv_cache_groups_kinds(vllm_config):
    from vllm.v1.core.kv_cache_utils import get_kv_cache_groups, is_kv_cache_spec_uniform
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    # All sliding window: one sliding-window group.
    (group,) = get_kv_cache_groups(vllm_config, {"a": sliding_spec(), "b": sliding_spec()})
    assert isinstance(group.kv_cache_spec, SlidingWindowSpec)

    # Full + sliding: the sliding layers are served as full attention.
    specs = {"full": full_spec(), "swa": sliding_spec(32)}
    assert not is_kv_cache_spec_uniform(specs)
    (group,) = get_kv_cache_groups(vllm_config, specs)
    assert group.layer_names == ["full", "swa"]
    assert specs["swa"] == full_spec(sliding_window=32)
    assert isinstance(group.kv_cache_spec, FullAttentionSpec)
    assert group.kv_cache_spec.sliding_window == 32

    # Layers with different page layouts would need several groups.
    with pytest.raises(NotImplementedError):
        get_kv_cache_groups(vllm_config, {"a": full_spec(64), "b": full_spec(32)})


def test_max_concurrency(vllm_config):
    from vllm.v1.core.kv_cache_utils import (
        get_kv_cache_configs,
        get_max_concurrency_for_kv_cache_config,
    )

    (config,) = get_kv_cache_configs(vllm_config, [{"layer": full_spec()}], [PAGE * 10])
    # A 64-token request takes 4 blocks of 16: 10 blocks hold 2.5 requests.
    assert get_max_concurrency_for_kv_cache_config(vllm_config, config) == 2.5
