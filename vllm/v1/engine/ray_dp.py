"""Data-parallel engine cores as Ray actors (`--data-parallel-backend ray`;
upstream: `CoreEngineActorManager` in vllm/v1/engine/utils.py and
`EngineCoreActor` in vllm/v1/engine/core.py).

One placement group per DP rank (`create_dp_placement_groups`, upstream's
"strict" packing): `world_size` device bundles for the rank's workers plus
one CPU "control" bundle for the engine-core actor, all on one node. The
`-dpl` local ranks go on the DP master node (`node:<data_parallel_master_ip>`,
the Ray head when the front end runs there), the others fill the remaining
nodes in order. On this CPU build the device bundles are `{"CPU": 1}`, so a
rank of world size W needs W + 1 CPUs on one Ray node.

The actor is an `EngineCoreProc` (`DPEngineCoreProc`, lock-step waves, for an
MoE model) without the start-up handshake: it gets the
front end's ZMQ addresses when it is built (tcp on the master address when
some engines are remote) and connects to them; `wait_for_init` returns what
the handshake's READY carries (KV blocks, max_model_len). `run` is its busy
loop, one long actor call. The manager watches those calls: an actor that
dies (killed, or its node lost) makes `sentinels()` readable, so the client
monitors Ray engines exactly as it monitors engine processes.

Deviations from upstream, on purpose: Ray must answer within
`RAY_CONNECT_TIMEOUT_S` and the actors must be built within
`VLLM_ENGINE_READY_TIMEOUT_S` (upstream waits without bound); not enough
resources for `-dp` is a ValueError naming the flag; only the "strict"
packing is built (VLLM_RAY_DP_PACK_STRATEGY "fill" / "span" are not); a
loopback -dpa means the Ray node this process is attached to.
"""

from __future__ import annotations

import contextlib
import copy
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import vllm.envs as envs
from vllm.logger import init_logger
from vllm.v1.engine.core_dp import DPEngineCoreProc
from vllm.v1.engine.core_proc import EngineCoreProc
from vllm.v1.engine.ipc import EngineZmqAddresses, allow_zmq_host
from vllm.v1.executor.ray_utils import (
    available_resources_per_node,
    connect_ray,
    ray,
    vllm_env_vars,
    wait_until_pg_ready,
)

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup

    from vllm.config import VllmConfig
    from vllm.v1.executor.abstract import Executor

logger = init_logger(__name__)

# Actor methods a client must not call as engine utilities.
_ACTOR_METHODS = frozenset(("run", "wait_for_init"))


if TYPE_CHECKING:
    _ActorBase = EngineCoreProc
else:
    _ActorBase = object  # the actor classes below put EngineCoreProc after the mixin


class EngineCoreActorMixin(_ActorBase):
    """What makes an engine core a Ray actor (upstream's name): the addresses
    instead of a handshake, `wait_for_init` and `run`."""

    addresses: EngineZmqAddresses

    def _set_dp_identity(
        self, vllm_config: VllmConfig, addresses: EngineZmqAddresses, dp_rank: int, local: int
    ) -> None:
        self.addresses = addresses
        parallel_config = vllm_config.parallel_config
        # The front end's sockets may be on the -dpa address (not loopback).
        allow_zmq_host(parallel_config.data_parallel_master_ip)
        parallel_config.data_parallel_index = dp_rank
        parallel_config.data_parallel_rank_local = local

    @contextlib.contextmanager
    def _perform_handshake(
        self,
        handshake_address: str,
        identity: bytes,
        local_client: bool,
        vllm_config: VllmConfig | None = None,
    ) -> Iterator[EngineZmqAddresses]:
        """No handshake: the addresses came with the actor (as upstream)."""
        yield self.addresses

    def wait_for_init(self) -> dict[str, int]:
        """Returns once __init__ has (the actor is built): what READY says."""
        model_config = self.vllm_config.model_config
        assert model_config is not None
        return {
            "num_gpu_blocks": self.vllm_config.cache_config.num_gpu_blocks or 0,
            "max_model_len": model_config.max_model_len,
        }

    def run(self) -> None:
        """The busy loop; a fatal error tells the clients (ENGINE_CORE_DEAD)."""
        try:
            self.run_busy_loop()
        except SystemExit:
            logger.debug("EngineCore actor exiting.")
            raise
        except Exception:
            logger.exception("EngineCore actor encountered a fatal error.")
            self._send_engine_dead()
            raise
        finally:
            self.shutdown()

    def _handle_utility(
        self, client_idx: int, call_id: int, method_name: str, args: list[Any]
    ) -> None:
        if method_name in _ACTOR_METHODS:
            method_name = "_" + method_name  # refused by EngineCoreProc as not a utility
        super()._handle_utility(client_idx, call_id, method_name, args)


class EngineCoreActor(EngineCoreActorMixin, EngineCoreProc):
    """A dense model's DP rank: an independent engine (EngineCoreProc runs it
    as DP=1, `reconfigure_for_independent_dp_rank`)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        local_client: bool,
        addresses: EngineZmqAddresses,
        executor_class: type[Executor],
        log_stats: bool,
        dp_rank: int = 0,
        local_dp_rank: int = 0,
    ) -> None:
        self._set_dp_identity(vllm_config, addresses, dp_rank, local_dp_rank)
        EngineCoreProc.__init__(
            self, vllm_config, local_client, "", executor_class, log_stats, engine_index=dp_rank
        )


class DPMoEEngineCoreActor(EngineCoreActorMixin, DPEngineCoreProc):
    """An MoE model's DP rank: steps in lock-step waves with the others."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        local_client: bool,
        addresses: EngineZmqAddresses,
        executor_class: type[Executor],
        log_stats: bool,
        dp_rank: int = 0,
        local_dp_rank: int = 0,
    ) -> None:
        vllm_config.parallel_config.data_parallel_rank = dp_rank
        self._set_dp_identity(vllm_config, addresses, dp_rank, local_dp_rank)
        DPEngineCoreProc.__init__(
            self, vllm_config, local_client, "", executor_class, log_stats, engine_index=dp_rank
        )


def _node_ip_from_resources(resources: dict[str, float]) -> str | None:
    """A node's IP from its `node:<ip>` resource (not the head marker)."""
    for key in resources:
        if key.startswith("node:") and key != "node:__internal_head__" and "_group_" not in key:
            return key.split(":", 1)[1]
    return None


def _master_node_ip(master_ip: str, per_node: dict[str, dict[str, float]]) -> str:
    """The Ray node of the DP master address. A loopback address (the
    default -dpa) means the node this process is attached to (beyond
    upstream, whose -dpa default for Ray is the host IP: Ray never names a
    node 127.0.0.1, and the front end's sockets stay on loopback)."""
    if master_ip not in ("127.0.0.1", "localhost", "::1"):
        return master_ip
    here = per_node.get(ray.get_runtime_context().get_node_id(), {})
    return _node_ip_from_resources(here) or master_ip


def create_dp_placement_groups(vllm_config: VllmConfig) -> tuple[list[PlacementGroup], list[int]]:
    """One STRICT_PACK placement group per DP rank, the first
    `data_parallel_size_local` on the master node; returns (groups, local
    rank of each on its node). Raises ValueError naming -dp when the cluster
    cannot hold them (checked against the available resources, then a
    bounded wait for Ray to place them)."""
    parallel_config = vllm_config.parallel_config
    master_ip = parallel_config.data_parallel_master_ip
    dp_size = parallel_config.data_parallel_size
    dp_size_local = parallel_config.data_parallel_size_local
    world_size = parallel_config.world_size
    per_node = available_resources_per_node()
    master_ip = _master_node_ip(master_ip, per_node)
    nodes = [(_node_ip_from_resources(r), r) for r in per_node.values()]
    nodes.sort(key=lambda node: node[0] != master_ip)
    if not nodes or nodes[0][0] != master_ip:
        raise ValueError(
            f"The DP master node (data_parallel_master_ip={master_ip}, -dpa) is not a node "
            f"of the Ray cluster: nodes {[ip for ip, _ in nodes]}."
        )
    groups: list[PlacementGroup] = []
    local_ranks: list[int] = []
    for ip, resources in nodes:
        # A rank needs world_size device bundles plus the control bundle.
        fits = int(resources.get("CPU", 0)) // (world_size + 1)
        if ip == master_ip and fits < dp_size_local:
            raise ValueError(
                f"Not enough resources to allocate {dp_size_local} DP ranks "
                f"(--data-parallel-size-local) on DP master node {master_ip}: "
                f"{fits} fit ({world_size} + 1 CPUs each)."
            )
        if ip != master_ip and fits < dp_size_local:
            logger.info("Skipping Ray node %s: %d DP ranks do not fit.", ip, dp_size_local)
            continue
        for local_rank in range(min(dp_size_local, dp_size - len(groups))):
            bundle = {"CPU": 1.0, f"node:{ip}": 0.001}
            groups.append(
                ray.util.placement_group(
                    [dict(bundle) for _ in range(world_size + 1)],
                    strategy="STRICT_PACK",
                    name=f"dp_rank_{len(groups)}",
                )
            )
            local_ranks.append(local_rank)
        if len(groups) == dp_size:
            break
    if len(groups) < dp_size:
        for pg in groups:
            ray.util.remove_placement_group(pg)
        raise ValueError(
            f"data_parallel_size={dp_size} (-dp/--data-parallel-size) needs {dp_size} "
            f"placement groups of {world_size} + 1 CPUs, {dp_size_local} per node "
            f"(--data-parallel-size-local); the Ray cluster holds {len(groups)}. "
            f"Available resources per node: {[r for _, r in nodes]}."
        )
    try:
        for rank, pg in enumerate(groups):
            wait_until_pg_ready(pg, f"DP rank {rank} (-dp/--data-parallel-size {dp_size})")
    except BaseException:
        for pg in groups:
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(pg)
        raise
    return groups, local_ranks


class CoreEngineActorManager:
    """Starts one engine-core actor per DP rank on its placement group, and
    stops them. Same monitoring interface as `CoreEngineProcManager`
    (`sentinels`, `finished_procs`, `closed`, `close`)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        addresses: EngineZmqAddresses,
        executor_class: type[Executor],
        log_stats: bool,
        placement_groups: list[PlacementGroup] | None = None,
        local_dp_ranks: list[int] | None = None,
    ) -> None:
        parallel_config = vllm_config.parallel_config
        dp_size = parallel_config.data_parallel_size
        self.local_engine_actors: list[Any] = []
        self.remote_engine_actors: list[Any] = []
        self.created_placement_groups: list[PlacementGroup] = []
        self.run_refs: dict[Any, str] = {}  # run() call -> engine name
        self.failed_proc_name: str | None = None
        self._dead: dict[str, int] = {}
        self._stopped = threading.Event()
        self._death_r, self._death_w = os.pipe()
        # A local Ray (no RAY_ADDRESS) gets the logical CPUs every rank needs.
        self._started_ray = connect_ray(num_cpus=dp_size * (parallel_config.world_size + 1))
        try:
            if placement_groups is None:
                placement_groups, local_dp_ranks = create_dp_placement_groups(vllm_config)
                self.created_placement_groups = list(placement_groups)
            assert local_dp_ranks is not None and len(placement_groups) == dp_size
            self._start_actors(
                vllm_config, addresses, executor_class, log_stats, placement_groups, local_dp_ranks
            )
        except BaseException:
            self.close()
            raise
        threading.Thread(
            target=self.monitor_engine_liveness, daemon=True, name="RayEngineMonitor"
        ).start()

    def _start_actors(
        self,
        vllm_config: VllmConfig,
        addresses: EngineZmqAddresses,
        executor_class: type[Executor],
        log_stats: bool,
        placement_groups: list[PlacementGroup],
        local_dp_ranks: list[int],
    ) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        parallel_config = vllm_config.parallel_config
        world_size = parallel_config.world_size
        names: dict[Any, str] = {}
        assert vllm_config.model_config is not None
        lockstep = parallel_config.data_parallel_size > 1 and vllm_config.model_config.is_moe
        actor_class = DPMoEEngineCoreActor if lockstep else EngineCoreActor
        for index, (local_index, pg) in enumerate(zip(local_dp_ranks, placement_groups)):
            dp_config = copy.deepcopy(vllm_config)
            # The Ray executor of this rank places its workers on the group's first bundles.
            dp_config.parallel_config.placement_group = pg
            local_client = index < parallel_config.data_parallel_size_local
            actor = (
                ray.remote(actor_class)
                .options(
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=pg, placement_group_bundle_index=world_size
                    ),
                    runtime_env={"env_vars": vllm_env_vars()},
                )
                .remote(
                    vllm_config=dp_config,
                    local_client=local_client,
                    addresses=addresses,
                    executor_class=executor_class,
                    log_stats=log_stats,
                    dp_rank=index,
                    local_dp_rank=local_index,
                )
            )
            (self.local_engine_actors if local_client else self.remote_engine_actors).append(actor)
            names[actor] = f"EngineCore_DP{index}"
        actors: list[Any] = list(names)
        ready = self._wait_for_init(actors, names)
        # What the engines decided at start-up becomes the front end's view.
        vllm_config.cache_config.num_gpu_blocks = min(r["num_gpu_blocks"] for r in ready)
        max_model_len = min(r["max_model_len"] for r in ready)
        assert vllm_config.model_config is not None
        vllm_config.model_config.max_model_len = max_model_len
        vllm_config.scheduler_config.max_model_len = max_model_len
        self.run_refs = {actor.run.remote(): names[actor] for actor in actors}

    @staticmethod
    def _wait_for_init(actors: list[Any], names: dict[Any, str]) -> list[dict[str, int]]:
        refs = [actor.wait_for_init.remote() for actor in actors]
        timeout = envs.VLLM_ENGINE_READY_TIMEOUT_S
        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError as e:
            raise TimeoutError(
                "Timed out waiting for the engine core actors to start "
                f"(VLLM_ENGINE_READY_TIMEOUT_S={timeout})"
            ) from e
        except ray.exceptions.RayActorError as e:
            raise RuntimeError(f"Engine core initialization failed: {e}") from e

    # ---- monitoring (the interface of CoreEngineProcManager) ----------------------------
    def monitor_engine_liveness(self) -> None:
        """Until close(): wait on the actors' run() calls; one that ends (the
        actor died, or its busy loop failed) marks it finished and makes
        `sentinels()` readable."""
        pending = list(self.run_refs)
        while pending and not self._stopped.is_set():
            done, pending = ray.wait(pending, num_returns=1, timeout=1.0)
            for ref in done:
                if self._stopped.is_set():
                    return
                name = self.run_refs[ref]
                try:
                    ray.get(ref, timeout=0)
                    logger.error("Engine core actor %s exited.", name)
                except Exception as e:
                    logger.error("Engine core actor %s died: %s", name, e)
                self._dead[name] = 1
                self.failed_proc_name = self.failed_proc_name or name
                with contextlib.suppress(OSError):
                    os.write(self._death_w, b"x")

    def sentinels(self) -> list[int]:
        """A file descriptor that turns readable when an engine actor dies
        (for multiprocessing.connection.wait, as process sentinels)."""
        return [self._death_r]

    def finished_procs(self) -> dict[str, int]:
        """Engine name -> 1 for each engine actor that has died."""
        return dict(self._dead)

    @property
    def closed(self) -> bool:
        return self._stopped.is_set()

    def close(self) -> None:
        """Kill the engine actors (their workers go with them), remove the
        placement groups made here, and Ray if started here (idempotent)."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        for actor in self.local_engine_actors + self.remote_engine_actors:
            with contextlib.suppress(Exception):
                ray.kill(actor)
        for pg in self.created_placement_groups:
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(pg)
        if self._started_ray:
            ray.shutdown()
        os.write(self._death_w, b"x")  # wake a client monitor still waiting

    def shutdown(self, timeout: float | None = None) -> None:
        """Upstream's name for close()."""
        self.close()
