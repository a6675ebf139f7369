"""Workers as Ray actors (upstream: vllm/v1/executor/ray_executor.py,
`RayDistributedExecutor`; `--distributed-executor-backend ray`).

One `RayWorkerWrapper` actor per rank, each pinned to a device bundle of a
placement group (see `initialize_ray_cluster`: the DP rank's group set by
`CoreEngineActorManager`, the caller's current group, or a new PACK group
whose first bundle is on this node). Ranks follow the bundles in node
order, this node first (`get_bundles_sorted_by_node`), so a TP group stays on
one node where it fits and may span nodes where it does not; local ranks
count per node. The actors join one torch.distributed world whose rendezvous
is on loopback when every worker is on this node, else on rank 0's node
address. `collective_rpc` has the same contract as the multiprocess
executor's: methods by name, arguments and results as msgpack,
`unique_reply_rank` returns one rank's result. A dead actor fails the call
and the executor (failure callback), so the engine dies instead of hanging.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from vllm.distributed.device_communicators.rpc_codec import RpcDecoder, RpcEncoder
from vllm.distributed.utils import get_distributed_init_method, get_open_port
from vllm.logger import init_logger
from vllm.v1.executor.abstract import Executor
from vllm.v1.executor.ray_utils import (
    RayWorkerWrapper,
    assert_ray_available,
    get_bundles_sorted_by_node,
    initialize_ray_cluster,
    ray,
    vllm_env_vars,
)

if TYPE_CHECKING:
    from vllm.v1.outputs import DraftTokenIds

logger = init_logger(__name__)


class RayDistributedExecutor(Executor):
    """Executor over Ray actors, one per rank, in a placement group."""

    uses_ray: bool = True
    supports_pp: bool = True

    def _init_executor(self) -> None:
        assert_ray_available()
        self.is_failed = False
        self.failure_callback: Callable[[], None] | None = None
        self.workers: list[Any] = []
        self.placement_group, self._started_ray, self._owns_placement_group = (
            initialize_ray_cluster(self.parallel_config, self.device_config.device_type)
        )
        self.world_size = self.parallel_config.world_size
        self._encoder, self._decoder = RpcEncoder(), RpcDecoder()
        self.io_thread_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ray_exec_io")
        try:
            self._init_workers_ray()
        except BaseException:
            self.shutdown()
            raise

    def _init_workers_ray(self) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        use_gpu = self.device_config.device_type == "cuda"
        # Ranks in node order, this node first: TP groups stay on one node
        # where they fit, and rank 0 (the rendezvous) is here when it can be.
        bundles = get_bundles_sorted_by_node(
            self.placement_group, self.world_size, "GPU" if use_gpu else "CPU"
        )
        for rank, (bundle_index, _, _) in enumerate(bundles):
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=self.placement_group,
                placement_group_bundle_index=bundle_index,
                placement_group_capture_child_tasks=True,
            )
            actor = (
                ray.remote(RayWorkerWrapper)
                .options(
                    num_cpus=0 if use_gpu else 1,
                    num_gpus=1 if use_gpu else 0,
                    scheduling_strategy=strategy,
                    runtime_env={"env_vars": vllm_env_vars()},
                )
                .remote(vllm_config=self.vllm_config, rpc_rank=rank)
            )
            self.workers.append(actor)
        node_ips = ray.get([w.get_node_ip.remote() for w in self.workers])
        self.collective_rpc("init_worker", args=(self._worker_init_kwargs(node_ips),))
        self.collective_rpc("init_device")
        self.collective_rpc("load_model")

    def _worker_init_kwargs(self, node_ips: list[str]) -> list[dict[str, Any]]:
        """Ranks, local ranks (per node) and the rendezvous: loopback when every
        worker is on this node, else rank 0's node address."""
        driver_ip = ray.util.get_node_ip_address()
        ip = "127.0.0.1" if set(node_ips) == {driver_ip} else node_ips[0]
        init_method = get_distributed_init_method(ip, get_open_port())
        if len(set(node_ips)) > 1:
            logger.info("Ray workers span nodes %s; rendezvous at %s", node_ips, init_method)
        return [
            dict(
                local_rank=node_ips[:rank].count(node_ips[rank]),
                rank=rank,
                distributed_init_method=init_method,
                is_driver_worker=rank == 0,
            )
            for rank in range(self.world_size)
        ]

    # ---- RPC -------------------------------------------------------------------------
    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        non_block: bool = False,
        unique_reply_rank: int | None = None,
    ) -> Any:
        """As `MultiprocExecutor.collective_rpc`, over Ray actor calls."""
        if not isinstance(method, str):
            raise TypeError(
                "RayDistributedExecutor calls worker methods by name; functions "
                "cannot be sent to the workers."
            )
        if self.is_failed:
            raise RuntimeError("Executor failed: a Ray worker died.")
        payload = [bytes(f) for f in self._encoder.encode((tuple(args), kwargs or {}))]
        refs = [w.execute_method.remote(method, payload) for w in self.workers]
        wanted = refs if unique_reply_rank is None else [refs[unique_reply_rank]]
        future = self.io_thread_pool.submit(
            self._get_results, method, wanted, timeout, unique_reply_rank is not None
        )
        return future if non_block else future.result()

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        # Only the output rank replies (its drafts are every rank's).
        return self.collective_rpc("take_draft_token_ids", unique_reply_rank=self.output_rank)

    def _step_rpc(self, method: str, arg: Any, non_block: bool) -> Any:
        """Only `output_rank` replies to a step, and its result comes back as is."""
        return self.collective_rpc(
            method, args=(arg,), non_block=non_block, unique_reply_rank=self.output_rank
        )

    def _get_results(
        self, method: str, refs: list[Any], timeout: float | None, single: bool
    ) -> Any:
        try:
            frames = ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError as e:
            raise TimeoutError(f"RPC call to {method} timed out.") from e
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as e:
            self._fail()
            raise RuntimeError("Executor failed: a Ray worker died.") from e
        results = [self._decoder.decode(f) for f in frames]
        return results[0] if single else results

    def _fail(self) -> None:
        if not self.is_failed:
            self.is_failed = True
            logger.error("A Ray worker died; the executor has failed.")
            if self.failure_callback is not None:
                self.failure_callback()

    def register_failure_callback(self, callback: Callable[[], None]) -> None:
        if self.is_failed:
            callback()
        else:
            self.failure_callback = callback

    # ---- properties and lifecycle ---------------------------------------------------------
    @property
    def max_concurrent_batches(self) -> int:
        """As the multiprocess executor: the engine core's batch queue size."""
        return self.vllm_config.max_concurrent_batches

    @classmethod
    def supports_async_scheduling(cls) -> bool:
        return True

    def check_health(self) -> None:
        self.collective_rpc("check_health", timeout=10)

    def shutdown(self) -> None:
        """Kill the actors; release the placement group and Ray if we made them."""
        if getattr(self, "_shut_down", False):
            return
        self._shut_down = True
        if (pool := getattr(self, "io_thread_pool", None)) is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        for worker in getattr(self, "workers", []):
            ray.kill(worker)
        self.workers = []
        pg = getattr(self, "placement_group", None)
        if pg is not None and getattr(self, "_owns_placement_group", False):
            ray.util.remove_placement_group(pg)
        if getattr(self, "_started_ray", False):
            ray.shutdown()
