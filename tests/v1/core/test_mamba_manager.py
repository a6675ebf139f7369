"""MambaManager: one state slot (block) per request, whatever its length."""

from __future__ import annotations

import pytest
import torch

from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.single_type_kv_cache_manager import MambaManager, get_manager_for_kv_cache_spec
from vllm.v1.kv_cache_interface import MambaSpec

MAX_MODEL_LEN = 128


def _spec() -> MambaSpec:
    return MambaSpec(
        block_size=MAX_MODEL_LEN, shapes=((96, 3), (96, 8)), dtypes=(torch.float32, torch.float32)
    )


def _manager(num_blocks: int = 4) -> MambaManager:
    pool = BlockPool(num_blocks, False, MAX_MODEL_LEN)
    manager = get_manager_for_kv_cache_spec(
        _spec(), block_pool=pool, enable_caching=False, kv_cache_group_id=0
    )
    assert isinstance(manager, MambaManager)
    return manager


def test_page_is_the_whole_state_and_usage_does_not_grow_with_length():
    spec = _spec()
    assert spec.page_size_bytes == (96 * 3 + 96 * 8) * 4
    assert spec.max_memory_usage_bytes(None) == spec.page_size_bytes


def test_one_slot_per_request_for_its_whole_life():
    manager = _manager()
    pool = manager.block_pool
    free_before = pool.get_num_free_blocks()
    assert manager.get_num_blocks_to_allocate("a", 5, [], 0) == 1
    (slot,) = manager.allocate_new_blocks("a", 5)
    for num_tokens in (6, 40, MAX_MODEL_LEN):  # decode / chunked prefill: no new block
        assert manager.get_num_blocks_to_allocate("a", num_tokens, [], 0) == 0
        assert manager.allocate_new_blocks("a", num_tokens) == []
    assert manager.req_to_blocks["a"] == [slot]
    assert pool.get_num_free_blocks() == free_before - 1
    manager.free("a")
    assert pool.get_num_free_blocks() == free_before


def test_prefix_caching_is_refused():
    pool = BlockPool(4, True, MAX_MODEL_LEN)
    with pytest.raises(ValueError, match="Prefix caching"):
        MambaManager(_spec(), block_pool=pool, enable_caching=True, kv_cache_group_id=0)
