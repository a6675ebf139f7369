"""KV connector telemetry (upstream: vllm/distributed/kv_transfer/kv_connector/v1/metrics.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class KVConnectorStats:
    """Base of a connector's transfer statistics; each connector subclasses it
    and implements the four methods (none is built here)."""

    data: dict[str, Any] = field(default_factory=dict)

    def reset(self) -> None:
        raise NotImplementedError

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        raise NotImplementedError

    def reduce(self) -> dict[str, int | float]:
        raise NotImplementedError

    def is_empty(self) -> bool:
        raise NotImplementedError
