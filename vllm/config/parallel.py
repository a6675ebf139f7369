"""Parallelism configuration (upstream: vllm/config/parallel.py).

Data parallelism (DP), as upstream: `data_parallel_size` engine cores, each
with its own workers (TP x PP) and KV cache. A dense model's DP ranks are
independent engines (`reconfigure_for_independent_dp_rank`); an MoE model's
ranks step in lock-step "waves" over a stateless gloo group
(`stateless_init_dp_group`, `has_unfinished_dp`). The front end balances
requests over the engines with the DP coordinator's queue stats
(vllm/v1/engine/coordinator.py).

`data_parallel_size_local` engines run on this node, starting at
`data_parallel_rank`; the others join over TCP at
`data_parallel_master_ip:data_parallel_rpc_port` (`--headless` nodes).
"""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

_BACKENDS = ("uni", "mp", "ray", "external_launcher")
DP_BACKENDS = ("mp", "ray")
EXPERT_PLACEMENT_STRATEGIES = ("linear", "round_robin")
# Upstream's all-to-all backends; only the collective-based one runs without
# the GPU kernels (DeepEP, MoRI, NIXL-EP, FlashInfer).
ALL2ALL_BACKENDS = (
    "allgather_reducescatter",
    "deepep_high_throughput",
    "deepep_low_latency",
    "mori_high_throughput",
    "mori_low_latency",
    "nixl_ep",
    "flashinfer_nvlink_two_sided",
    "flashinfer_nvlink_one_sided",
)
BUILT_ALL2ALL_BACKENDS = ("allgather_reducescatter",)


class ExecutorClassLike(Protocol):
    """What the config reads of an executor class given as the backend (an
    `Executor` subclass; vllm.config does not import vllm.v1, see .importlinter)."""

    @classmethod
    def supports_async_scheduling(cls) -> bool: ...


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    # Number of data parallel engine cores (each with TP x PP workers).
    data_parallel_size: int = 1
    # How many of them run on this node (the rest are remote, headless).
    data_parallel_size_local: int = 1
    # Rank of the first local engine (0 on the head node).
    data_parallel_rank: int = 0
    # Local rank of this engine, set in an engine process (None in the front end).
    data_parallel_rank_local: int | None = None
    # Address of the DP head node: the coordinator, the handshake with
    # remote engines and the DP process group listen there.
    data_parallel_master_ip: str = "127.0.0.1"
    # Port of the start-up handshake with remote (headless) engines.
    data_parallel_rpc_port: int = 29550
    # Port of the DP torch.distributed group (MoE waves).
    data_parallel_master_port: int = 29500
    data_parallel_backend: str = "mp"
    data_parallel_external_lb: bool = False
    data_parallel_hybrid_lb: bool = False
    # Whether the model is MoE (None: not known), from ModelConfig.
    is_moe_model: bool | None = None
    enable_expert_parallel: bool = False
    expert_placement_strategy: str = "linear"
    all2all_backend: str = "allgather_reducescatter"
    # None = chosen: uni for world size 1, ray inside a Ray placement group, else mp.
    # Or an Executor subclass (upstream: type[Executor]).
    distributed_executor_backend: str | type[ExecutorClassLike] | None = None
    # The Ray placement group of this engine's workers (set per DP rank by the
    # Ray DP backend, vllm/v1/engine/ray_dp.py; upstream's field).
    placement_group: Any = None
    # Ports for the DP groups (popped by get_next_dp_init_port).
    _data_parallel_master_port_list: list[int] = field(default_factory=list)
    # Number of API server processes, and this one's index (-1: not an API server).
    _api_process_count: int = 1
    _api_process_rank: int = 0
    # The engine's DP rank, kept when an independent rank is reconfigured to DP=1.
    data_parallel_index: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1.")
        self._verify_data_parallel()
        self._verify_expert_parallel()
        backend = self.distributed_executor_backend
        if isinstance(backend, str) and backend not in _BACKENDS:
            raise ValueError(
                f"Unknown distributed executor backend {backend!r}; choose one of {_BACKENDS}."
            )
        if backend is None:
            self.distributed_executor_backend = self._default_backend()

    def _verify_data_parallel(self) -> None:
        """Upstream's checks of the DP fields (and the modes not built here)."""
        if self.data_parallel_backend not in DP_BACKENDS:
            raise ValueError(
                f"data_parallel_backend={self.data_parallel_backend!r} "
                f"(--data-parallel-backend) must be one of {DP_BACKENDS}."
            )
        if not 0 <= self.data_parallel_size_local <= self.data_parallel_size:
            raise ValueError(
                f"data_parallel_size_local ({self.data_parallel_size_local}) "
                f"must be <= data_parallel_size ({self.data_parallel_size})"
            )
        if not 0 <= self.data_parallel_rank < self.data_parallel_size:
            raise ValueError(
                f"data_parallel_rank ({self.data_parallel_rank})"
                f" must be in the range [0, {self.data_parallel_size})"
            )
        if self.data_parallel_size <= 1 and self.data_parallel_external_lb:
            raise ValueError(
                "data_parallel_external_lb can only be set when data_parallel_size > 1"
            )
        address = self.data_parallel_master_ip
        if not address or "://" in address or any(c.isspace() for c in address):
            raise ValueError(
                f"data_parallel_master_ip={address!r} (--data-parallel-address / -dpa) must "
                "be a host name or IP address."
            )
        if not 1 <= self.data_parallel_rpc_port <= 65535:
            raise ValueError(
                f"data_parallel_rpc_port ({self.data_parallel_rpc_port}) must be in [1, 65535]"
            )
        if self._api_process_rank >= self._api_process_count:
            raise ValueError(
                "Invalid value of `_api_process_rank`. "
                f"Expected to be `-1` or `[0, {self._api_process_count})`, "
                f"but found: {self._api_process_rank}"
            )
        if self.data_parallel_size > 1 and not self._data_parallel_master_port_list:
            # As upstream: the front end picks the DP group ports once; every
            # engine gets this config, so all ranks pop the same ports.
            self._data_parallel_master_port_list = _get_open_ports(5)
            self.data_parallel_master_port = self._data_parallel_master_port_list.pop()
        self.data_parallel_index = self.data_parallel_rank

    def _verify_expert_parallel(self) -> None:
        """The expert-parallel options: upstream's choices, and the all-to-all
        backends built here."""
        if self.expert_placement_strategy not in EXPERT_PLACEMENT_STRATEGIES:
            raise ValueError(
                f"expert_placement_strategy={self.expert_placement_strategy!r} "
                f"(--expert-placement-strategy) must be one of {EXPERT_PLACEMENT_STRATEGIES}."
            )
        if self.all2all_backend not in ALL2ALL_BACKENDS:
            raise ValueError(
                f"all2all_backend={self.all2all_backend!r} (--all2all-backend) must be one "
                f"of {ALL2ALL_BACKENDS}."
            )
        if self.all2all_backend not in BUILT_ALL2ALL_BACKENDS:
            raise ValueError(
                f"all2all_backend={self.all2all_backend!r} (--all2all-backend) needs GPU "
                f"kernels that are not built here; use one of {BUILT_ALL2ALL_BACKENDS}."
            )

    def _default_backend(self) -> str:
        """As upstream: uni for one worker; ray with the Ray DP backend, a
        placement group given, or when this process already runs inside a Ray
        placement group; else mp (one node)."""
        if self.world_size == 1:
            return "uni"
        if self.data_parallel_backend == "ray" or self.placement_group is not None:
            # As upstream: "Using ray distributed inference because
            # data_parallel_backend is ray".
            return "ray"
        if _in_ray_placement_group():
            return "ray"
        return "mp"

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def world_size_across_dp(self) -> int:
        """Process world size across TP, PP and DP."""
        return self.world_size * self.data_parallel_size

    @property
    def local_engines_only(self) -> bool:
        """The client manages local and remote engines with internal load
        balancing; only its local ones in hybrid and external LB modes."""
        return self.data_parallel_external_lb or self.data_parallel_hybrid_lb

    @property
    def use_ray(self) -> bool:
        return self.distributed_executor_backend == "ray"

    def get_next_dp_init_port(self) -> int:
        """A port for a DP process group: popped from the prepared list, else
        the master port (then incremented), as upstream."""
        if self._data_parallel_master_port_list:
            return self._data_parallel_master_port_list.pop()
        answer = self.data_parallel_master_port
        self.data_parallel_master_port += 1
        return answer

    def stateless_init_dp_group(self, timeout_s: float = 300.0) -> ProcessGroup:
        """A gloo process group over the DP ranks, outside torch's default
        group (the workers own that one), as upstream: a TCPStore on
        data_parallel_master_ip (rank 0 hosts it) and a gloo group on it."""
        import datetime

        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(
            self.data_parallel_master_ip,
            self.get_next_dp_init_port(),
            self.data_parallel_size,
            is_master=self.data_parallel_rank == 0,
            timeout=timeout,
        )
        return dist.ProcessGroupGloo(  # type: ignore[return-value]
            dist.PrefixStore("dp", store),
            self.data_parallel_rank,
            self.data_parallel_size,
            timeout,
        )

    @staticmethod
    def has_unfinished_dp(dp_group: ProcessGroup, has_unfinished: bool) -> bool:
        """Whether any DP rank has unfinished requests (an all-reduce MAX)."""
        import torch
        import torch.distributed

        tensor = torch.tensor([has_unfinished], dtype=torch.int32, device="cpu")
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX, group=dp_group)
        return bool(tensor.item())

    def reconfigure_for_independent_dp_rank(self) -> None:
        """A dense model's DP rank is an independent engine: it runs as DP=1
        (`data_parallel_index` keeps its rank)."""
        self.data_parallel_size = 1
        self.data_parallel_size_local = 1
        self.data_parallel_rank = 0


def _get_open_ports(count: int) -> list[int]:
    """`count` distinct free TCP ports on the loopback interface."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _in_ray_placement_group() -> bool:
    """Whether Ray is initialised here and this task runs in a placement group.
    Ray is only consulted when the caller has imported it already."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    from ray.util import get_current_placement_group

    return get_current_placement_group() is not None
