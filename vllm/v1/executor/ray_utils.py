"""Ray helpers for the Ray executor (upstream: vllm/v1/executor/ray_utils.py).

`RayWorkerWrapper` is the actor class: a `WorkerWrapperBase` whose calls
arrive as (method name, msgpack payload) and whose results leave as msgpack,
so our messages never rely on pickling (Ray's own transport aside).
"""

from __future__ import annotations

import os
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


def initialize_ray_cluster(
    parallel_config: ParallelConfig, device_type: str = "cpu", ray_address: str | None = None
) -> tuple[PlacementGroup, bool]:
    """Connect to Ray (an existing cluster at `ray_address` / RAY_ADDRESS, or
    a local one started here) and get a placement group with one bundle per
    worker: the current one if this task runs in one, else a new one.
    Returns (placement group, whether this call started Ray)."""
    assert_ray_available()
    started = False
    if not ray.is_initialized():
        address = ray_address or os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(
                num_cpus=parallel_config.world_size, include_dashboard=False, log_to_driver=False
            )
            started = True
    device = "GPU" if device_type == "cuda" else "CPU"
    current = get_current_placement_group()
    if current is not None:
        bundles = [b for b in current.bundle_specs if b.get(device, 0) > 0]
        if len(bundles) < parallel_config.world_size:
            raise ValueError(
                f"The current placement group has {len(bundles)} {device} "
                f"bundles; {parallel_config.world_size} workers need one each."
            )
        return current, started
    pg = placement_group([{device: 1.0}] * parallel_config.world_size, strategy="PACK")
    try:
        ray.get(pg.ready(), timeout=120)
    except ray.exceptions.GetTimeoutError as e:
        ray.util.remove_placement_group(pg)
        raise ValueError(
            f"Ray cannot place {parallel_config.world_size} workers with one "
            f"{device} each; cluster resources: {ray.cluster_resources()}."
        ) from e
    return pg, started
