"""KV cache event publishing (upstream: vllm/config/kv_events.py).

The record exists with upstream's fields. The events themselves
(`vllm.distributed.kv_events`) are emitted by the block pool when
`enable_kv_cache_events` is set on the `KVCacheManager`; publishing them over
ZMQ is not built, so `VllmConfig` refuses a config that enables them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

_PUBLISHERS = ("null", "zmq")


@dataclass
class KVEventsConfig:
    """Configuration for KV event publishing."""

    enable_kv_cache_events: bool = False
    """Track block storage and removal as events."""

    publisher: Literal["null", "zmq"] | None = None
    """Where events go: "null" drops them, "zmq" publishes them. Defaults to
    "zmq" when events are enabled, else "null"."""

    endpoint: str = "tcp://*:5557"
    """ZMQ endpoint events are published on."""

    replay_endpoint: str | None = None
    """ZMQ endpoint for replaying past events."""

    buffer_steps: int = 10_000
    """Steps of events kept for the replay endpoint."""

    hwm: int = 100_000
    """ZMQ high-water mark of the publisher."""

    max_queue_size: int = 100_000
    """Events queued while waiting to be published."""

    topic: str = ""
    """Topic consumers subscribe to."""

    def __post_init__(self) -> None:
        if self.publisher is None:
            self.publisher = "zmq" if self.enable_kv_cache_events else "null"
        if self.publisher not in _PUBLISHERS:
            raise ValueError(
                f"KVEventsConfig.publisher must be one of {_PUBLISHERS}, got {self.publisher!r}"
            )
