"""`EngineArgs` -> `ParallelConfig`: the data-parallel launch options resolved
as upstream's `EngineArgs.create_engine_config` does (vllm/engine/arg_utils.py),
kept apart because arg_utils.py is long.

    -dp N                    N engines on this node (data_parallel_size_local = N)
    -dp N -dpl L             L here, ranks 0..L-1; the rest join as --headless nodes
    -dp N -dpl L -dpr R      --headless: this node runs ranks R..R+L-1
    -dpa ADDR -dpp PORT      where the head node's handshake listens

Refused here (errors naming the flag): external and hybrid load balancing
(not built), and more engine processes than this machine's CPU cores
(upstream's CUDA check of world size against the GPUs, for CPU).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from vllm.config import DeviceConfig, ModelConfig, ParallelConfig
from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.engine.arg_utils import EngineArgs

logger = init_logger(__name__)


def create_parallel_config(
    args: EngineArgs, model_config: ModelConfig, device_config: DeviceConfig, headless: bool
) -> ParallelConfig:
    """The ParallelConfig of `args` (upstream's DP rules, minus --nnodes)."""
    dp_size = args.data_parallel_size
    _refuse_unbuilt_lb_modes(args)
    dp_size_local = args.data_parallel_size_local
    if dp_size_local is None:
        dp_size_local = dp_size
    if args.data_parallel_start_rank is not None and not headless:
        raise ValueError(
            "data_parallel_start_rank (--data-parallel-start-rank / -dpr) is for "
            "secondary nodes started with --headless (hybrid load balancing, where an "
            "API server runs on every node, is not built yet)."
        )
    parallel_config = ParallelConfig(
        tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size,
        data_parallel_size=dp_size,
        data_parallel_size_local=dp_size_local,
        data_parallel_rank=args.data_parallel_start_rank or 0,
        data_parallel_master_ip=_data_parallel_address(args),
        data_parallel_rpc_port=(
            args.data_parallel_rpc_port
            if args.data_parallel_rpc_port is not None
            else ParallelConfig.data_parallel_rpc_port
        ),
        data_parallel_backend=args.data_parallel_backend,
        is_moe_model=model_config.is_moe,
        enable_expert_parallel=args.enable_expert_parallel,
        expert_placement_strategy=args.expert_placement_strategy,
        all2all_backend=args.all2all_backend,
        distributed_executor_backend=args.distributed_executor_backend,
        _api_process_count=args._api_process_count,
        _api_process_rank=args._api_process_rank,
    )
    if device_config.device_type == "cpu" and parallel_config.data_parallel_backend == "mp":
        _check_cpu_resources(parallel_config)
    return parallel_config


def _data_parallel_address(args: EngineArgs) -> str:
    """-dpa, else (as upstream) this host's IP with the Ray backend (Ray names
    its nodes by IP), else loopback."""
    if args.data_parallel_address is not None:
        return args.data_parallel_address
    if args.data_parallel_backend == "ray":
        from vllm.distributed.utils import get_ip

        host_ip = get_ip()
        logger.info("Using host IP %s as ray-based data parallel address", host_ip)
        return host_ip
    return ParallelConfig.data_parallel_master_ip


def _refuse_unbuilt_lb_modes(args: EngineArgs) -> None:
    if args.data_parallel_hybrid_lb and args.data_parallel_external_lb:
        raise ValueError(
            "Invalid data-parallel launch options: "
            "`--data-parallel-hybrid-lb` and "
            "`--data-parallel-external-lb` cannot be enabled together. "
            "Enable only one load-balancing mode."
        )
    if args.data_parallel_external_lb or args.data_parallel_rank is not None:
        raise ValueError(
            "data_parallel_external_lb (--data-parallel-external-lb / -dpe, or "
            "--data-parallel-rank / -dpn) is not built yet: one API server balances "
            "over all DP engines (internal load balancing)."
        )
    if args.data_parallel_hybrid_lb:
        raise ValueError(
            "data_parallel_hybrid_lb (--data-parallel-hybrid-lb / -dph) is not built yet: "
            "one API server balances over all DP engines (internal load balancing)."
        )


def _check_cpu_resources(parallel_config: ParallelConfig) -> None:
    """Every engine's workers need a core: refuse more local worker processes
    than the cores this process may run on (upstream refuses a world size
    larger than the node's GPUs)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    local_workers = parallel_config.data_parallel_size_local * parallel_config.world_size
    if parallel_config.data_parallel_size > 1 and local_workers > cores:
        raise ValueError(
            f"data_parallel_size_local ({parallel_config.data_parallel_size_local}, "
            f"--data-parallel-size / -dp) x world size ({parallel_config.world_size}) = "
            f"{local_workers} worker processes is larger than the {cores} CPU cores "
            "available on this node. Use a smaller -dp, or run the other ranks on "
            "another node (--headless --data-parallel-start-rank)."
        )
