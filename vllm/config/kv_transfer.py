"""KV transfer between instances (upstream: vllm/config/kv_transfer.py).

The record exists with upstream's fields so that configs and tests can name
it; KV connectors (disaggregated prefill, offloading) are not built, so
`VllmConfig` refuses a config that sets one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

KVProducer = Literal["kv_producer", "kv_both"]
KVConsumer = Literal["kv_consumer", "kv_both"]
KVRole = Literal["kv_producer", "kv_consumer", "kv_both"]


@dataclass
class KVTransferConfig:
    """Configuration of the KV cache transfer connector."""

    kv_connector: str | None = None
    """The connector's name (e.g. "NixlConnector")."""
    engine_id: str | None = None
    """This engine's id for KV transfers."""
    kv_buffer_device: str = "cuda"
    """Device of the transfer buffer."""
    kv_buffer_size: float = 1e9
    """Transfer buffer size in bytes."""
    kv_role: KVRole | None = None
    """Producer, consumer or both."""
    kv_rank: int | None = None
    """Rank of this instance in the transfer group."""
    kv_parallel_size: int = 1
    """Number of instances in the transfer group."""
    kv_ip: str = "127.0.0.1"
    kv_port: int = 14579
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)
    """Connector-specific options."""
    kv_connector_module_path: str | None = None
    """Module to load an out-of-tree connector from."""
    enable_permute_local_kv: bool = False
    kv_load_failure_policy: Literal["recompute", "fail"] = "fail"

    def __post_init__(self) -> None:
        if self.kv_role is not None and self.kv_role not in get_args(KVRole):
            raise ValueError(
                f"Unsupported kv_role: {self.kv_role!r}. Supported roles are {get_args(KVRole)}"
            )
        if self.kv_connector is not None and self.kv_role is None:
            raise ValueError(
                "Please specify kv_role when kv_connector "
                f"is set, supported roles are {get_args(KVRole)}"
            )

    @property
    def is_kv_transfer_instance(self) -> bool:
        return self.kv_connector is not None and self.kv_role in get_args(KVRole)

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_connector is not None and self.kv_role in get_args(KVProducer)

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_connector is not None and self.kv_role in get_args(KVConsumer)

    def get_from_extra_config(self, key: str, default: Any) -> Any:
        return self.kv_connector_extra_config.get(key, default)
