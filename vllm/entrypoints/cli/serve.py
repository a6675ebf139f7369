"""`vllm serve [model]` (upstream: vllm/entrypoints/cli/serve.py): the
OpenAI-compatible API server. Without a model it serves the embedded
default model.

Three ways to run, as upstream (`ServeSubcommand.cmd` picks one):

* one API server (the default with one engine): `run_server` in this process,
  which starts the engine core(s) itself;
* `--api-server-count N > 1` (the default with `-dp N`, internal load
  balancing): `run_multi_api_server` binds the port, starts the engine cores
  (and the DP coordinator), then N API server processes that share the port,
  each one client of every engine core; any process dying stops them all;
* `--headless`: `run_headless` runs only this node's engine cores, which
  connect to the head node's front end (multi-node data parallelism).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import TYPE_CHECKING, Any

from vllm.entrypoints.cli.types import CLISubcommand
from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)


class ServeSubcommand(CLISubcommand):
    """The `serve` subcommand for the vLLM CLI."""

    name = "serve"

    @staticmethod
    def cmd(args: argparse.Namespace) -> None:
        from vllm.entrypoints.openai.api_server import run_server

        if args.headless:
            args.api_server_count = 0
        elif args.api_server_count is None:
            args.api_server_count = default_api_server_count(args)
        try:
            if args.api_server_count < 1:
                run_headless(args)
            elif args.api_server_count > 1:
                run_multi_api_server(args)
            else:
                asyncio.run(run_server(args))
        except KeyboardInterrupt:
            logger.info("Interrupted during start-up; exiting.")
            sys.exit(130)

    def validate(self, args: argparse.Namespace) -> None:
        try:
            validate_parsed_serve_args(args)
        except ValueError as e:
            raise SystemExit(f"vllm serve: error: {e}") from None

    def subparser_init(self, subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
        parser = subparsers.add_parser(
            self.name,
            help="Start the vLLM OpenAI Compatible API server.",
            description="Start the vLLM OpenAI Compatible API server.",
            usage="vllm serve [model_tag] [options]",
        )
        return make_arg_parser(parser)


def cmd_init() -> list[CLISubcommand]:
    return [ServeSubcommand()]


def default_api_server_count(args: argparse.Namespace) -> int:
    """Upstream's default: one API server per DP rank it balances over (all of
    them with internal load balancing, the local ones in hybrid mode), one
    with an external load balancer."""
    if args.data_parallel_external_lb or args.data_parallel_rank is not None:
        return 1
    if args.data_parallel_hybrid_lb or args.data_parallel_start_rank is not None:
        return args.data_parallel_size_local or 1
    count: int = args.data_parallel_size
    if count > 1:
        logger.info("Defaulting api_server_count to data_parallel_size (%d).", count)
    return count


def _exit_on_signals() -> list[bool]:
    """SIGTERM / SIGINT raise SystemExit once (the `finally` blocks then stop
    every process); returns a flag list whose item is set when that happened."""
    requested = [False]

    def handler(signum: int, frame: Any) -> None:
        logger.debug("Received signal %d.", signum)
        if not requested[0]:
            requested[0] = True
            raise SystemExit

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return requested


def run_multi_api_server(args: argparse.Namespace) -> None:
    """`--api-server-count N > 1`: the engine cores, then N API servers on one
    socket; returns when they have all stopped (SIGTERM / SIGINT here stops
    everything; any of them dying stops the rest)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.openai.api_server import run_api_server_worker_proc, setup_server
    from vllm.entrypoints.openai.embedding_model import check_main_model
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.warm_spawn import prestart_spawn
    from vllm.v1.engine.ipc import EngineZmqAddresses, get_open_zmq_ipc_path
    from vllm.v1.engine.utils import launch_core_engines
    from vllm.v1.executor.abstract import Executor
    from vllm.v1.metrics.prometheus import setup_multiprocess_prometheus
    from vllm.v1.utils import APIServerProcessManager, wait_for_completion_or_failure

    num_api_servers: int = args.api_server_count
    assert num_api_servers > 1 and not args.headless
    setup_multiprocess_prometheus()
    shutdown_requested = _exit_on_signals()
    listen_address, sock = setup_server(args, reuse_port=True)
    engine_args = AsyncEngineArgs.from_cli_args(args)
    engine_args._api_process_count = num_api_servers
    engine_args._api_process_rank = -1
    vllm_config = engine_args.create_engine_config(UsageContext.OPENAI_API_SERVER)
    check_main_model(args, vllm_config.model_config)
    # The servers' interpreters import (~5 s each on 2 cores) while the engines
    # start: once the config is valid (not for a refused one), and after
    # setup_multiprocess_prometheus(), which sets their environment.
    prestart_spawn(num_api_servers, kind="api_server")
    # One input and one output socket per API server; each server binds its
    # pair, every engine core connects to all of them.
    addresses = EngineZmqAddresses(
        inputs=[get_open_zmq_ipc_path() for _ in range(num_api_servers)],
        outputs=[get_open_zmq_ipc_path() for _ in range(num_api_servers)],
    )
    engine_manager = coordinator = api_server_manager = None
    try:
        with launch_core_engines(
            vllm_config, Executor.get_class(vllm_config), not args.disable_log_stats, addresses
        ) as engine_launch:
            engine_manager = engine_launch.engine_manager
            coordinator = engine_launch.coordinator
        # After the handshake: the engines' own max_model_len and KV-cache
        # size (now in vllm_config) go to the servers with their addresses.
        api_server_manager = APIServerProcessManager(
            run_api_server_worker_proc,
            listen_address,
            sock,
            args,
            num_api_servers,
            addresses.inputs,
            addresses.outputs,
            stats_update_address=(
                coordinator.get_stats_publish_address() if coordinator is not None else None
            ),
            engine_ready_info=_engine_ready_info(vllm_config),
        )
        sock.close()  # the servers hold their copies
        wait_for_completion_or_failure(
            api_server_manager,
            engine_manager,
            [coordinator.proc] if coordinator is not None else (),
        )
    finally:
        timeout = args.shutdown_timeout + 5.0 if shutdown_requested[0] else None
        if api_server_manager is not None:
            api_server_manager.shutdown(timeout=timeout)
        if engine_manager is not None:
            engine_manager.close()
        if coordinator is not None:
            coordinator.close()
        sock.close()


def _engine_ready_info(vllm_config: VllmConfig) -> dict[str, int]:
    """What the engine cores decided at start-up (their READY handshake),
    for the API servers' copies of the config."""
    assert vllm_config.model_config is not None
    return {
        "num_gpu_blocks": vllm_config.cache_config.num_gpu_blocks or 0,
        "max_model_len": vllm_config.model_config.max_model_len,
    }


def run_headless(args: argparse.Namespace) -> None:
    """`--headless`: this node's engine cores only (ranks
    data_parallel_start_rank .. + data_parallel_size_local - 1); they hand
    shake with the head node at data_parallel_address:data_parallel_rpc_port.
    Runs until an engine exits (raises RuntimeError) or SIGTERM / SIGINT."""
    from multiprocessing import connection

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.core_proc import EngineCoreProc
    from vllm.v1.engine.utils import CoreEngineProcManager
    from vllm.v1.executor.abstract import Executor

    engine_args = AsyncEngineArgs.from_cli_args(args)
    vllm_config = engine_args.create_engine_config(UsageContext.OPENAI_API_SERVER, headless=True)
    parallel_config = vllm_config.parallel_config
    local_engine_count = parallel_config.data_parallel_size_local
    if local_engine_count <= 0:
        raise ValueError("data_parallel_size_local must be > 0 in headless mode")
    shutdown_requested = _exit_on_signals()
    host = parallel_config.data_parallel_master_ip
    handshake_address = f"tcp://{host}:{parallel_config.data_parallel_rpc_port}"
    logger.info(
        "Launching %d data parallel engine(s) in headless mode, with head node address %s.",
        local_engine_count,
        handshake_address,
    )
    engine_manager = CoreEngineProcManager(
        EngineCoreProc.run_engine_core,
        local_engine_count=local_engine_count,
        start_index=parallel_config.data_parallel_rank,
        local_start_index=0,
        vllm_config=vllm_config,
        local_client=False,
        handshake_address=handshake_address,
        executor_class=Executor.get_class(vllm_config),
        log_stats=not engine_args.disable_log_stats,
    )
    try:
        connection.wait(engine_manager.sentinels())
        if not shutdown_requested[0]:
            raise RuntimeError(f"Engine core process(es) exited: {engine_manager.finished_procs()}")
    finally:
        logger.info("Shutting down.")
        engine_manager.close()
