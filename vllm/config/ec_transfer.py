"""Encoder-cache transfer between instances (upstream: vllm/config/ec_transfer.py).

The record exists with upstream's fields; EC connectors (and the encoder cache
they move) are not built, so `VllmConfig` refuses a config that sets one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

ECRole = Literal["ec_producer", "ec_consumer", "ec_both"]


@dataclass
class ECTransferConfig:
    """Configuration of the encoder cache transfer connector."""

    ec_connector: str | None = None
    engine_id: str | None = None
    ec_buffer_device: str | None = "cuda"
    ec_buffer_size: float = 1e9
    ec_role: ECRole | None = None
    ec_rank: int | None = None
    ec_parallel_size: int = 1
    ec_ip: str = "127.0.0.1"
    ec_port: int = 14579
    ec_connector_extra_config: dict[str, Any] = field(default_factory=dict)
    ec_connector_module_path: str | None = None

    def __post_init__(self) -> None:
        if self.ec_role is not None and self.ec_role not in get_args(ECRole):
            raise ValueError(
                f"Unsupported ec_role: {self.ec_role!r}. Supported roles are {get_args(ECRole)}"
            )
