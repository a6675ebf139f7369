"""Ray helpers for the Ray executor (upstream: vllm/v1/executor/ray_utils.py).

`RayWorkerWrapper` is the actor class: a `WorkerWrapperBase` whose calls
arrive as (method name, msgpack payload) and whose results leave as msgpack,
so our messages never rely on pickling (Ray's own transport aside).
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any

from vllm.distributed.device_communicators.rpc_codec import RpcDecoder, RpcEncoder
from vllm.logger import init_logger
from vllm.v1.outputs import AsyncModelRunnerOutput
from vllm.v1.worker.worker_base import WorkerWrapperBase

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup

    from vllm.config import ParallelConfig, VllmConfig

logger = init_logger(__name__)

try:
    import ray
    from ray.util import get_current_placement_group
    from ray.util.placement_group import placement_group

    ray_import_err: ImportError | None = None
except ImportError as e:  # Ray is an optional dependency (extra "ray")
    ray = None  # type: ignore[assignment]
    ray_import_err = e


def assert_ray_available() -> None:
    if ray is None:
        raise ValueError("The Ray executor needs Ray: pip install 'vllm[ray]'.") from ray_import_err


class RayWorkerWrapper(WorkerWrapperBase):
    """The worker of one rank inside a Ray actor."""

    def __init__(self, vllm_config: VllmConfig, rpc_rank: int = 0) -> None:
        super().__init__(vllm_config, rpc_rank)
        self._encoder = RpcEncoder()
        self._decoder = RpcDecoder()

    def init_worker(self, all_kwargs: list[dict[str, Any]]) -> None:
        """As WorkerWrapperBase.init_worker; the config is the one the actor
        was built with (it does not travel with every call)."""
        super().init_worker([dict(kw, vllm_config=self.vllm_config) for kw in all_kwargs])

    def get_node_ip(self) -> str:
        return ray.util.get_node_ip_address()

    def get_pid(self) -> int:
        return os.getpid()

    def execute_method(self, method: str, payload: list[bytes]) -> list[bytes]:
        """Run worker method `method` (a name) with the msgpack-encoded
        (args, kwargs); return the msgpack-encoded result."""
        if not isinstance(method, str):
            raise TypeError("RPC methods are called by name.")
        args, kwargs = self._decoder.decode(payload)
        output = getattr(self, method)(*args, **kwargs)
        if isinstance(output, AsyncModelRunnerOutput):
            output = output.get_output()
        return [bytes(frame) for frame in self._encoder.encode(output)]


def vllm_env_vars() -> dict[str, str]:
    """The VLLM_* variables of this process, for the actors' runtime env (Ray
    workers otherwise see the environment the Ray node started with)."""
    return {k: v for k, v in os.environ.items() if k.startswith("VLLM_")}


RAY_CONNECT_TIMEOUT_S = 10.0
PG_WAIT_TIMEOUT_S = 120.0


def connect_ray(ray_address: str | None = None, num_cpus: int | None = None) -> bool:
    """Connect this process to Ray: the cluster at `ray_address` / RAY_ADDRESS
    (checked to answer first: `ray.init` waits minutes on a dead address), or
    a local Ray started here with `num_cpus` logical CPUs. Returns whether this
    call started Ray (then the caller shuts it down)."""
    assert_ray_available()
    if ray.is_initialized():
        return False
    address = ray_address or os.environ.get("RAY_ADDRESS")
    if address:
        _check_reachable(address)
        ray.init(address=address, log_to_driver=False)
        return False
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    return True


def _check_reachable(address: str) -> None:
    """Fail fast, with the address in the message, when nothing answers there."""
    if address == "auto":
        return  # Ray finds a local cluster itself, and fails fast without one
    host_port = address.removeprefix("ray://")
    host, _, port = host_port.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), RAY_CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as e:
        raise ConnectionError(
            f"Cannot reach the Ray cluster at {address!r} (RAY_ADDRESS) within "
            f"{RAY_CONNECT_TIMEOUT_S:.0f} s: {e}. Start it with `ray start --head` "
            "or fix the address."
        ) from e


def wait_until_pg_ready(pg: PlacementGroup, what: str) -> None:
    """Wait (bounded) until Ray has placed `pg`; else remove it and raise a
    ValueError that names `what` needed it and what the cluster has."""
    try:
        ray.get(pg.ready(), timeout=PG_WAIT_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError as e:
        ray.util.remove_placement_group(pg)
        raise ValueError(
            f"Ray cannot place {what} (placement group bundles {pg.bundle_specs}) "
            f"within {PG_WAIT_TIMEOUT_S:.0f} s; available resources per node: "
            f"{available_resources_per_node()}. See `ray status`."
        ) from e


def available_resources_per_node() -> dict[str, dict[str, float]]:
    """Node id -> its available resources (Ray's private state API, as upstream)."""
    from ray._private.state import available_resources_per_node as per_node

    return per_node()


def get_bundles_sorted_by_node(
    pg: PlacementGroup, world_size: int, device: str
) -> list[tuple[int, str, str]]:
    """(bundle index, node id, node ip) of the first `world_size` device
    bundles of `pg`, the driver's node first (as upstream). Bundles after
    those (a DP engine's control bundle, also a CPU bundle here) are not for
    workers."""
    from ray.util.placement_group import placement_group_table

    bundle_to_node = placement_group_table(pg)["bundles_to_node_id"]
    node_ip = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    indices = [i for i, spec in enumerate(pg.bundle_specs) if spec.get(device, 0) > 0]
    bundles = [(i, bundle_to_node[i], node_ip[bundle_to_node[i]]) for i in indices[:world_size]]
    driver_node = ray.get_runtime_context().get_node_id()
    bundles.sort(key=lambda b: (b[1] != driver_node, b[1]))
    return bundles


def initialize_ray_cluster(
    parallel_config: ParallelConfig, device_type: str = "cpu", ray_address: str | None = None
) -> tuple[PlacementGroup, bool, bool]:
    """Connect to Ray (`connect_ray`) and get a placement group with one
    device bundle per worker: `parallel_config.placement_group` (a DP rank's,
    set by CoreEngineActorManager), else the current one if this task runs in
    one, else a new one (PACK, its first bundle on this node, as upstream).
    Returns (placement group, whether this call started Ray, whether it
    created the group)."""
    started = connect_ray(ray_address, num_cpus=parallel_config.world_size)
    device = "GPU" if device_type == "cuda" else "CPU"
    current = parallel_config.placement_group or get_current_placement_group()
    if current is not None:
        bundles = [b for b in current.bundle_specs if b.get(device, 0) > 0]
        if len(bundles) < parallel_config.world_size:
            raise ValueError(
                f"The current placement group has {len(bundles)} {device} "
                f"bundles; {parallel_config.world_size} workers need one each."
            )
        return current, started, False
    specs: list[dict[str, float]] = [{device: 1.0} for _ in range(parallel_config.world_size)]
    # Rank 0 on this (the engine's) node, as upstream.
    specs[0][f"node:{ray.util.get_node_ip_address()}"] = 0.001
    pg = placement_group(specs, strategy="PACK")
    try:
        wait_until_pg_ready(pg, f"{parallel_config.world_size} workers with one {device} each")
    except BaseException:
        if started:
            ray.shutdown()
        raise
    return pg, started, True
