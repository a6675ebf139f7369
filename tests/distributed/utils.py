"""A gloo world of spawned processes, for the tests of process groups and of
layers under tensor / expert parallelism (tests/distributed, tests/lora)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

from vllm.distributed.utils import get_distributed_init_method, get_open_port


def init_gloo_rank(world_size: int, rank: int, init_method: str, tp: int, pp: int = 1) -> None:
    """In a rank's process: one torch thread (the ranks share two cores), the
    world over gloo, then vLLM's TP x PP (x DP = the rest) groups."""
    import torch

    from vllm import distributed as d

    torch.set_num_threads(1)
    d.init_distributed_environment(world_size, rank, init_method, rank, "gloo")
    d.initialize_model_parallel(tp, pp)


def run_gloo_world(
    target: Callable[..., None], world_size: int, *args: Any, timeout: float = 120
) -> dict[int, Any]:
    """Spawn `world_size` processes running `target(rank, init_method, *args,
    out)`; each puts `(rank, result)` on `out`. Returns rank -> result once
    every process has exited 0 (a rank still running after its result and 30 s
    more is killed, and fails the test)."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    init_method = get_distributed_init_method("127.0.0.1", get_open_port())
    procs = [
        ctx.Process(target=target, args=(r, init_method, *args, out)) for r in range(world_size)
    ]
    for p in procs:
        p.start()
    try:
        results = dict(out.get(timeout=timeout) for _ in range(world_size))
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join(5)
    codes = [p.exitcode for p in procs]
    assert codes == [0] * world_size, f"rank exit codes {codes}"
    return results
