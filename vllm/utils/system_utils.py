"""Process start-up helpers (upstream: vllm/utils/system_utils.py).

`get_mp_context()` is the one place that picks how vLLM starts its own child
processes (engine cores, TP/PP workers, the DP coordinator):
`VLLM_WORKER_MULTIPROC_METHOD`, default ``spawn`` (upstream: ``fork``), from a
pre-started interpreter when the `vllm` command left one (warm_spawn.py). A forked child
starts with everything the parent imported (torch, transformers, the model
config) instead of importing it again: on a 2-core machine that is most of a
server's start-up. ``spawn`` is forced, with a warning, where fork is unsafe:
CUDA already initialized in this process (a forked child cannot use it), or
this process being a Ray actor (its child must join the cluster itself).
The API server processes of `--api-server-count` are always spawned (they run
their own event loops; upstream does the same).

`exit_skipping_teardown()` ends a vLLM process whose work is done without the
interpreter's module teardown (see there).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import os
import socket
import sys
import weakref
from multiprocessing.connection import Connection
from multiprocessing.context import ForkContext, SpawnContext
from typing import NoReturn, TypeVar

from vllm import envs
from vllm.logger import init_logger

logger = init_logger(__name__)


def _cuda_is_initialized() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized()


def _is_in_ray_actor() -> bool:
    ray = sys.modules.get("ray")  # never import ray just to ask
    if ray is None or not ray.is_initialized():
        return False
    return ray.get_runtime_context().get_actor_id() is not None


def _maybe_force_spawn() -> None:
    """Switch VLLM_WORKER_MULTIPROC_METHOD to spawn where fork cannot work."""
    if os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") == "spawn":
        return
    reasons = []
    if _is_in_ray_actor():
        import ray

        # A spawned child joins the same cluster through this address.
        os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
        reasons.append("In a Ray actor and can only be spawned")
    if _cuda_is_initialized():
        reasons.append("CUDA is initialized")
    if reasons:
        logger.warning(
            "We must use the `spawn` multiprocessing start method. Overriding "
            "VLLM_WORKER_MULTIPROC_METHOD to 'spawn'. Reasons: %s",
            "; ".join(reasons),
        )
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"


# Descriptors that only the process that made them may hold. A forked child
# inherits every open descriptor, so without this:
# - the writer of a child's death pipe (the child learns of its parent's death
#   by EOF, which never comes while any process still holds the writer: the
#   child's own copy, or a later sibling's) would keep engines and workers
#   alive after their parent died;
# - the API server's listening socket would stay bound in the engine core, and
#   a client would connect to a port no server accepts on.
# Each forked child closes its copies first thing.
_Closable = TypeVar("_Closable", Connection, socket.socket)
_parent_only_ends: weakref.WeakSet[Connection | socket.socket] = weakref.WeakSet()


def parent_only(end: _Closable) -> _Closable:
    """Register a pipe end or socket to be closed in every child forked after this."""
    _parent_only_ends.add(end)
    return end


def _close_parent_only_ends() -> None:
    for conn in list(_parent_only_ends):
        with contextlib.suppress(OSError):
            conn.close()  # this process's copy only: the parent's stays open
    _parent_only_ends.clear()


os.register_at_fork(after_in_child=_close_parent_only_ends)


def get_mp_context() -> ForkContext | SpawnContext:
    """The multiprocessing context vLLM starts its child processes with
    (spawn's takes a pre-started interpreter when `prestart_spawn` left one)."""
    _maybe_force_spawn()
    if envs.VLLM_WORKER_MULTIPROC_METHOD == "spawn":
        from vllm.utils.warm_spawn import WARM_SPAWN_CONTEXT

        return WARM_SPAWN_CONTEXT
    return multiprocessing.get_context("fork")


def set_process_title(name: str) -> None:
    """Name this process (what `ps -o comm` and psutil's name() show) on
    Linux, as upstream's set_process_title: "EngineCore_DP1", "DPCoordinator",
    "VllmWorker-0". A forked child would otherwise carry its parent's name."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
        comm.write(name[:15])


def exit_skipping_teardown(code: int, *, run_exit_hooks: bool) -> NoReturn:
    """End this process with `code` once its work is done, skipping the
    interpreter's module teardown: its garbage collection walks the whole
    heap of torch, transformers and the tokenizer (~0.8 s on an idle 2-core
    machine, over 5 s on a loaded one: past a parent's SIGTERM grace) only to
    free memory the exit frees anyway, and lets nanobind report "leaked"
    triton objects. (gc.freeze() instead of this kept the teardown and the
    reports.) With `run_exit_hooks`, what a normal exit runs first still runs:
    the wait for non-daemon threads, then the atexit hooks (the tracing
    exporter's flush, logging's shutdown); without, only logging is flushed
    (child processes whose parent owns the rest)."""
    if run_exit_hooks:
        threading_shutdown = getattr(sys.modules.get("threading"), "_shutdown", None)
        if threading_shutdown is not None:
            threading_shutdown()
        atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
