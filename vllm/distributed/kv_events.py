"""KV cache events (upstream: vllm/distributed/kv_events.py).

The block pool records one event per change to the prefix cache when a
`KVCacheManager` is built with `enable_kv_cache_events=True`: blocks stored
(with their hashes and tokens), blocks removed (evicted), all cleared (prefix
cache reset). `take_events()` hands them over. Publishing them (ZMQ) is not
built: `KVEventsConfig` with a publisher other than "null" is refused.
"""

from __future__ import annotations

from typing import Any

import msgspec

from vllm.v1.core.block_hash import ExternalBlockHash

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"


class EventBatch(
    msgspec.Struct,
    array_like=True,  # type: ignore[call-arg]
    omit_defaults=True,  # type: ignore[call-arg]
    gc=False,  # type: ignore[call-arg]
):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(
    msgspec.Struct,
    omit_defaults=True,  # type: ignore[call-arg]
    gc=False,  # type: ignore[call-arg]
    tag=True,
):
    """Base of every KV cache event (tagged: the class name travels with it)."""


class BlockStored(KVCacheEvent):
    """Blocks newly in the prefix cache, in chain order after
    `parent_block_hash`; `token_ids` are all their tokens."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None  # deprecated upstream in favour of lora_name
    medium: str | None
    lora_name: str | None
    # One entry per block: the extra keys its hash was computed with.
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None

    def __hash__(self) -> int:
        return hash(
            (
                tuple(self.block_hashes),
                self.parent_block_hash,
                tuple(self.token_ids),
                self.block_size,
                self.lora_id,
                self.medium,
                tuple(self.extra_keys) if self.extra_keys else None,
                self.group_idx,
                self.kv_cache_spec_kind,
                self.kv_cache_spec_sliding_window,
                self.locality,
            )
        )


class BlockRemoved(KVCacheEvent):
    """Blocks evicted from the prefix cache."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None

    def __hash__(self) -> int:
        return hash((tuple(self.block_hashes), self.medium, self.group_idx, self.locality))


class AllBlocksCleared(KVCacheEvent):
    """The whole prefix cache was reset."""


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
