"""Upstream v0.28's KV-cache data contracts and the behaviour behind them:
chunked local attention, multimodal block-hash keys, admission watermark /
reserved blocks / whole-sequence gate, spec kinds on KV events, and refusals of
the unbuilt features those contracts can name."""

import pytest
import torch

from tests.v1.core.scheduler_utils import create_scheduler
from tests.v1.core.utils import make_kv_cache_config, make_request
from vllm.config import KVTransferConfig, SpeculativeConfig, VllmConfig
from vllm.distributed.kv_events import BlockStored
from vllm.lora.request import LoRARequest
from vllm.multimodal.inputs import MultiModalFeatureSpec, MultiModalKwargsItem, PlaceholderRange
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.encoder_cache_manager import EncoderCacheManager
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import (
    get_request_block_hasher,
    init_none_hash,
    make_block_hash_with_group_id,
)
from vllm.v1.core.single_type_kv_cache_manager import (
    ChunkedLocalAttentionManager,
    FullAttentionManager,
    get_manager_for_kv_cache_spec,
)
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    KVCacheSpecKind,
    KVCacheSpecRegistry,
    MLAAttentionSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
    get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window,
    get_max_in_flight_tokens,
    get_max_model_len,
)
from vllm.v1.kv_cache_spec import uniform_type_base
from vllm.v1.metrics.stats import CachingMetrics, PrefixCacheStats
from vllm.v1.request import Request


@pytest.fixture(autouse=True)
def _none_hash():
    init_none_hash(sha256)


def _attn(cls=FullAttentionSpec, **kw):
    return cls(block_size=4, num_kv_heads=2, head_size=8, dtype=torch.float32, **kw)


def test_spec_family_page_sizes_kinds_and_grouping():
    # K and V rows by default; a separate V size counts; MLA has no V.
    assert _attn().page_size_bytes == 2 * 4 * 2 * 8 * 4
    assert _attn(head_size_v=4).page_size_bytes == 4 * 2 * (8 + 4) * 4
    assert _attn(MLAAttentionSpec).page_size_bytes == 4 * 2 * 8 * 4
    sw = _attn(SlidingWindowSpec, sliding_window=8)
    assert get_kv_cache_spec_kind(sw) is KVCacheSpecKind.SLIDING_WINDOW
    assert get_kv_cache_spec_sliding_window(sw) == 8
    assert get_kv_cache_spec_kind(_attn(MLAAttentionSpec)) is KVCacheSpecKind.MLA_ATTENTION
    # Full attention and MLA group together (same token slots); a window does not.
    mixed = {"a": _attn(), "b": _attn(MLAAttentionSpec)}
    group = UniformTypeKVCacheSpecs.from_specs(mixed)
    assert group is not None and get_kv_cache_spec_kind(group) is KVCacheSpecKind.FULL_ATTENTION
    assert group.page_size_bytes == mixed["a"].page_size_bytes + mixed["b"].page_size_bytes
    assert UniformTypeKVCacheSpecs.from_specs({"a": _attn(), "b": sw}) is None


def _cached_blocks(pool: BlockPool, req: Request, n: int):
    blocks = pool.get_new_blocks(n)
    pool.cache_full_blocks(req, blocks, 0, n, 4, kv_cache_group_id=0)
    return blocks


def test_chunked_local_attention_hits_and_frees_only_the_current_chunk():
    spec = _attn(ChunkedLocalAttentionSpec, attention_chunk_size=8)  # 2 blocks a chunk
    pool = BlockPool(num_gpu_blocks=12, enable_caching=True, hash_block_size=4)
    req = make_request("0", list(range(24)), 4, sha256)  # 6 full blocks
    blocks = _cached_blocks(pool, req, 6)
    hit, hit_len = ChunkedLocalAttentionManager.find_longest_cache_hit(
        block_hashes=req.block_hashes,
        max_length=22,
        kv_cache_group_ids=[0],
        block_pool=pool,
        kv_cache_spec=spec,
        drop_eagle_block=False,
        alignment_tokens=4,
    )
    # Token 22 lives in chunk [16, 24): blocks 0-3 are outside its window (null,
    # counted as computed), block 4 is a hit; block 5 is not whole within 22.
    assert hit[0][:4] == [pool.null_block] * 4 and hit[0][4:] == [blocks[4]]
    assert hit_len == 20
    manager = get_manager_for_kv_cache_spec(
        spec, block_pool=pool, enable_caching=True, kv_cache_group_id=0
    )
    assert isinstance(manager, ChunkedLocalAttentionManager)
    assert manager.get_num_skipped_tokens(15) == 8 and manager.get_num_skipped_tokens(16) == 16
    manager.req_to_blocks["0"] = list(blocks)
    free_before = pool.get_num_free_blocks()
    manager.remove_skipped_blocks("0", 17)  # the first two chunks are done
    assert manager.req_to_blocks["0"][:4] == [pool.null_block] * 4
    assert pool.get_num_free_blocks() == free_before + 4


def test_full_attention_hit_returns_blocks_and_length():
    pool = BlockPool(num_gpu_blocks=6, enable_caching=True, hash_block_size=4)
    req = make_request("0", list(range(10)), 4, sha256)
    blocks = _cached_blocks(pool, req, 2)
    hit, hit_len = FullAttentionManager.find_longest_cache_hit(
        block_hashes=req.block_hashes,
        max_length=9,
        kv_cache_group_ids=[0],
        block_pool=pool,
        kv_cache_spec=_attn(),
        drop_eagle_block=True,
        alignment_tokens=4,
    )
    assert hit == ([blocks[0]],) and hit_len == 4  # EAGLE drops the last hit


def _mm_request(identifier: str, offset: int) -> Request:
    sp = SamplingParams(max_tokens=4)
    feature = MultiModalFeatureSpec(
        data=MultiModalKwargsItem.dummy(),
        modality="image",
        identifier=identifier,
        mm_position=PlaceholderRange(offset=offset, length=3),
    )
    return Request(
        "r", [7] * 12, sp, mm_features=[feature], block_hasher=get_request_block_hasher(4, sha256)
    )


def test_multimodal_items_key_the_blocks_they_overlap():
    a, b = _mm_request("img-a", 5), _mm_request("img-b", 5)
    # Block 0 (tokens 0-3) holds no image: equal; block 1 (4-7) holds it: differs,
    # and the chain carries the difference into block 2.
    assert a.block_hashes[0] == b.block_hashes[0]
    assert a.block_hashes[1] != b.block_hashes[1]
    assert a.block_hashes[2] != b.block_hashes[2]
    # The same item at another place inside the block is another block.
    assert _mm_request("img-a", 6).block_hashes[1] != a.block_hashes[1]


def _manager(num_blocks: int, **kw) -> KVCacheManager:
    return KVCacheManager(
        make_kv_cache_config(4, num_blocks),
        max_model_len=64,
        scheduler_block_size=4,
        hash_block_size=4,
        **kw,
    )


def test_watermark_holds_back_waiting_requests_only_while_others_run():
    manager = _manager(11, watermark=0.2)  # 10 usable blocks, 2 kept free
    req = make_request("0", list(range(36)), 4, sha256)  # needs 9 blocks
    assert manager.allocate_slots(req, 36, has_scheduled_reqs=True) is None
    assert manager.allocate_slots(req, 36, has_scheduled_reqs=False) is not None


def test_reserved_blocks_and_whole_sequence_gate():
    manager = _manager(11)
    req = make_request("0", list(range(36)), 4, sha256)
    assert manager.allocate_slots(req, 36, reserved_blocks=2) is None
    # The first 8-token chunk fits, but not the whole 36-token prompt.
    small = _manager(6)
    req2 = make_request("1", list(range(36)), 4, sha256)
    assert small.allocate_slots(req2, 8, full_sequence_must_fit=True) is None
    assert small.allocate_slots(req2, 8) is not None


def test_events_carry_the_groups_spec_kind():
    manager = _manager(8, enable_caching=True, enable_kv_cache_events=True)
    req = make_request("0", list(range(8)), 4, sha256)
    manager.allocate_slots(req, 8)
    (event,) = manager.take_events()
    assert isinstance(event, BlockStored) and len(event.block_hashes) == 2
    assert event.kv_cache_spec_kind == KVCacheSpecKind.FULL_ATTENTION.value


def test_caching_metrics_keep_a_window_of_recent_requests():
    metrics = CachingMetrics(max_recent_requests=2)
    for hits in (0, 4, 8):
        metrics.observe(PrefixCacheStats(requests=1, queries=8, hits=hits))
    assert metrics.aggregated_requests == 2 and metrics.hit_rate == 12 / 16
    metrics.observe(PrefixCacheStats(reset=True))
    assert metrics.empty


def test_unbuilt_features_are_refused_by_name():
    with pytest.raises(NotImplementedError, match="speculative"):
        VllmConfig(
            speculative_config=SpeculativeConfig(method="ngram_gpu", num_speculative_tokens=2)
        )
    with pytest.raises(NotImplementedError, match="kv_connector"):
        VllmConfig(kv_transfer_config=KVTransferConfig(kv_connector="X", kv_role="kv_both"))
    with pytest.raises(NotImplementedError, match="resumable"):
        Request("r", [1], SamplingParams(), resumable=True)
    with pytest.raises(NotImplementedError, match="scheduler_block_size"):
        KVCacheManager(
            make_kv_cache_config(4, 4), max_model_len=64, scheduler_block_size=8, hash_block_size=4
        )
    with pytest.raises(NotImplementedError, match="encoder cache"):
        EncoderCacheManager(cache_size=16)
    pool = BlockPool(num_gpu_blocks=4, enable_caching=False, hash_block_size=4)
    with pytest.raises(NotImplementedError, match="CrossAttentionSpec"):
        get_manager_for_kv_cache_spec(
            _attn(CrossAttentionSpec), block_pool=pool, enable_caching=False, kv_cache_group_id=0
        )
    with pytest.raises(ValueError, match="id must be > 0"):
        LoRARequest("a", 0, "/p")
    with pytest.raises(NotImplementedError):
        pool.blocks[1].set_block_hash(make_block_hash_with_group_id(b"x", 0), num_tokens=2)


def test_event_of_an_unknown_group_is_passed_on_unlabelled():
    manager = _manager(5, enable_caching=True, enable_kv_cache_events=True)
    event = BlockStored(
        block_hashes=[1],
        parent_block_hash=None,
        token_ids=[0, 1, 2, 3],
        block_size=4,
        lora_id=None,
        medium=None,
        lora_name=None,
        group_idx=1,
    )
    manager.block_pool.kv_event_queue.append(event)
    assert manager.take_events() == [event] and event.kv_cache_spec_kind is None


def test_mixed_precision_and_mamba_configs_need_zeroed_blocks():
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MambaSpec

    def config(*specs):
        return KVCacheConfig(
            num_blocks=4,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], spec) for i, spec in enumerate(specs)],
        )

    assert not config(_attn(), _attn()).needs_kv_cache_zeroing
    half = FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8, dtype=torch.float16)
    assert config(_attn(), half).needs_kv_cache_zeroing
    mamba = MambaSpec(block_size=64, shapes=((2, 3),), dtypes=(torch.float32,))
    assert config(mamba).needs_kv_cache_zeroing


def test_full_report_mode_emits_events_for_reused_blocks():
    manager = _manager(8, enable_caching=True, enable_kv_cache_events=True)
    manager.allocate_slots(make_request("0", list(range(9)), 4, sha256), 9)
    manager.take_events()
    for mode, expected in (("incremental", 0), ("full", 1)):
        sp = SamplingParams(max_tokens=4, extra_args={"kv_cache_report_mode": mode})
        req = Request(mode, list(range(9)), sp, block_hasher=get_request_block_hasher(4, sha256))
        blocks, num_hit, _ = manager.get_computed_blocks(req)
        assert num_hit == 8
        events = manager.take_events()
        assert len(events) == expected
    (event,) = events
    assert event.parent_block_hash is None and event.token_ids == list(range(8))


def test_scheduler_refuses_requests_using_unbuilt_features():
    from tests.v1.core.scheduler_utils import create_scheduler

    scheduler = create_scheduler(max_num_batched_tokens=64)
    lora = Request(
        "l",
        [1, 2],
        SamplingParams(max_tokens=2),
        lora_request=LoRARequest("adapter", 1, "/adapters/a"),
    )
    with pytest.raises(ValueError, match="LoRA"):
        scheduler.add_request(lora)
    with pytest.raises(ValueError, match="Multimodal"):
        scheduler.add_request(_mm_request("img", 0))
    assert not scheduler.requests and not scheduler.waiting


def test_evictable_hit_is_counted_once_and_not_allocated_again():
    spec = SlidingWindowSpec(
        block_size=2, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=4
    )
    pool = BlockPool(num_gpu_blocks=10, enable_caching=True, hash_block_size=2)
    manager = get_manager_for_kv_cache_spec(
        spec, block_pool=pool, enable_caching=True, kv_cache_group_id=0, scheduler_block_size=2
    )
    evictable = pool.blocks[1]  # ref_cnt 0: taking it costs a free block too
    assert manager.get_num_blocks_to_allocate("r", 4, [evictable], 2, 2, 4) == 2
    manager.add_local_computed_blocks(
        "r", [evictable], num_local_computed_tokens=2, num_external_computed_tokens=0
    )
    assert len(manager.allocate_new_blocks("r", num_tokens=4, num_tokens_main_model=4)) == 1
    assert manager.req_to_blocks["r"][0] is evictable and evictable.ref_cnt == 1
    with pytest.raises(NotImplementedError, match="Partial-block"):
        manager.add_local_computed_blocks("s", [pool.blocks[2]], 1, 0)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_windowed_kv_sizing_matches_the_schedulers_admission_cap(async_scheduling):
    """A sliding-window request is sized (max_memory_usage_bytes) for the blocks
    the scheduler's admission cap lets it hold: one token budget per batch in
    flight, two batches with async scheduling."""
    scheduler = create_scheduler(
        max_num_batched_tokens=32, max_model_len=512, async_scheduling=async_scheduling
    )
    config = scheduler.vllm_config
    in_flight = get_max_in_flight_tokens(config)
    assert in_flight == config.max_concurrent_batches * 32
    assert scheduler.kv_cache_manager.max_in_flight_tokens == in_flight
    spec = _attn(SlidingWindowSpec, sliding_window=16)
    blocks = spec.max_admission_blocks_per_request(in_flight, get_max_model_len(config))
    assert spec.max_memory_usage_bytes(config) == blocks * spec.page_size_bytes


def test_spec_grouping_needs_no_registration_and_managers_register_on_first_use(monkeypatch):
    """The registry is a leaf the specs import: a built-in spec type names its
    own grouping base, and the built-in managers are registered by the first
    manager built (also after an out-of-tree registration came first)."""
    from vllm.v1 import kv_cache_spec_registry

    class OutOfTreeSpec(FullAttentionSpec):
        pass

    monkeypatch.setattr(kv_cache_spec_registry, "_REGISTRY", {})
    mla, sw = _attn(MLAAttentionSpec), _attn(SlidingWindowSpec, sliding_window=8)
    assert uniform_type_base(mla) is FullAttentionSpec
    assert uniform_type_base(sw) is SlidingWindowSpec
    assert _attn(EncoderOnlyAttentionSpec).default_uniform_type_base() is None
    KVCacheSpecRegistry.register(OutOfTreeSpec, FullAttentionManager, FullAttentionSpec)
    assert KVCacheSpecRegistry.get_manager_class(sw) is None
    pool = BlockPool(num_gpu_blocks=4, enable_caching=False, hash_block_size=4)
    manager = get_manager_for_kv_cache_spec(
        sw, block_pool=pool, enable_caching=False, kv_cache_group_id=0
    )
    assert type(manager).__name__ == "SlidingWindowManager"
    assert KVCacheSpecRegistry.get_uniform_type_base_spec(mla) is FullAttentionSpec
