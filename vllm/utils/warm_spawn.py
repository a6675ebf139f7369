"""Spawn from a pre-started interpreter (ours; upstream starts cold).

A spawned engine core spends its first ~5 s of a 2-core machine importing torch,
transformers and the engine before it reads its arguments. `prestart_spawn()`
starts that interpreter early, as the `vllm` command's first act, so the import
runs while the API server imports and builds its config. The child is an
ordinary spawn child (a fresh interpreter, a direct child of this process) that
has imported `_PRELOAD` and waits on a pipe; `WARM_SPAWN_CONTEXT.Process.start()`
hands it the pickled process object, and it runs from there exactly as
`multiprocessing.spawn` would (same preparation data, same `_bootstrap`).

The pipe carries one byte "go", the values of `_LATE_ENV` (a length-prefixed
JSON object) and then spawn's two pickles. The byte tells a waiting child the
difference between work and its parent's exit (EOF: it leaves quietly).
Descriptors that travel in the pickle (Connections) go through
multiprocessing's resource sharer instead of being inherited at exec time:
they did not exist when the child was started.

Children come in two kinds, each with its own imports and its own context:
"engine" (`WARM_SPAWN_CONTEXT`: engine cores, workers, the DP coordinator) and
"api_server" (`WARM_API_SERVER_CONTEXT`: the API servers of
`--api-server-count N`, pre-started by `vllm serve` once its config is valid,
so that their imports overlap the engines' start-up).

A pre-started child is used only when this process's environment is the one it
was started with: modules it imported already read the environment (logging
level, OpenMP settings). Otherwise it is stopped and the start is a cold spawn.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import signal
import struct
import sys
import threading
from multiprocessing import context, reduction, resource_sharer, spawn, util
from multiprocessing.popen_fork import Popen as _ForkPopen
from multiprocessing.popen_spawn_posix import Popen as _SpawnPopen
from typing import Any

from vllm.logger import init_logger

logger = init_logger(__name__)

# Variables the parent may set after a pre-start: they are not compared, but
# sent with the work and set in the child before it runs. Only those that
# nothing a child imports reads at import time belong here. `vllm serve
# --api-server-count N` points PROMETHEUS_MULTIPROC_DIR at its metrics
# directory once it knows N, after the engine core was pre-started; engine
# cores record no Prometheus metrics (their stats go to the API servers).
_LATE_ENV = ("PROMETHEUS_MULTIPROC_DIR",)

# What each kind of pre-started child imports while it waits. An engine core:
# the engine, the worker, the model loader and layers, and the Llama family
# (its config class arrives pickled inside the VllmConfig; its model is the
# embedded default's). An API server: the server module.
_PRELOAD = {
    "engine": (
        "vllm.v1.engine.core_proc",
        "vllm.v1.worker.gpu_worker",
        "vllm.model_executor.model_loader",
        "vllm.model_executor.models.llama",
        "vllm.compilation.decorators",
        "vllm.lora.layers",
        "vllm.model_executor.layers.quantization.gguf",
        "transformers.models.llama.configuration_llama",
    ),
    "api_server": ("vllm.entrypoints.openai.api_server",),
}


@dataclasses.dataclass
class _Ready:
    pid: int
    sentinel: int  # readable at the child's exit (it holds the only writer)
    to_child: int  # the pipe its work arrives on
    env: dict[str, str]
    kind: str


_ready: list[_Ready] = []
_lock = threading.Lock()


def prestart_spawn(count: int = 1, kind: str = "engine") -> None:
    """Start `count` interpreters that import what a child of `kind` needs
    (`_PRELOAD`) and wait for work."""
    if kind not in _PRELOAD:
        raise ValueError(f"unknown kind of pre-started process {kind!r} (one of {list(_PRELOAD)})")
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    tracker_fd = resource_tracker.getfd()
    assert tracker_fd is not None  # ensure_running() started it
    for _ in range(count):
        child_r, to_child = os.pipe()
        sentinel, child_w = os.pipe()
        code = (
            f"from vllm.utils.warm_spawn import _child_main; "
            f"_child_main({child_r}, {tracker_fd}, {sys.path!r}, {kind!r})"
        )
        flags = util._args_from_interpreter_flags()  # type: ignore[attr-defined]
        cmd = [spawn.get_executable(), *flags, "-c", code]
        try:
            pid = util.spawnv_passfds(cmd[0], cmd, [child_r, child_w, tracker_fd])
        finally:
            os.close(child_r)
            os.close(child_w)
        with _lock:
            _ready.append(_Ready(pid, sentinel, to_child, dict(os.environ), kind))


def _take(kind: str) -> _Ready | None:
    """A waiting child of `kind` started under this environment, if one is
    alive (stale ones of that kind met on the way are discarded)."""
    with _lock:
        for child in [c for c in _ready if c.kind == kind]:
            _ready.remove(child)
            env, child_env = _compared_env(dict(os.environ)), _compared_env(child.env)
            if child_env == env and os.waitpid(child.pid, os.WNOHANG) == (0, 0):
                return child
            keys = env.keys() | child_env.keys()
            changed = sorted(k for k in keys if env.get(k) != child_env.get(k))
            logger.debug("Pre-started process %d unused: %s changed", child.pid, changed)
            _discard(child)
    return None


def _compared_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in _LATE_ENV}


def _discard(child: _Ready) -> None:
    os.close(child.to_child)  # EOF: it exits
    os.close(child.sentinel)
    threading.Thread(target=_reap, args=(child.pid,), daemon=True).start()


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


class _WarmPopen(_ForkPopen):
    """spawn's Popen over a pre-started child: poll/wait/terminate as spawn's."""

    method = "spawn"
    DupFd = staticmethod(resource_sharer.DupFd)

    def __init__(self, process_obj: Any, child: _Ready) -> None:
        self._child = child
        super().__init__(process_obj)

    def duplicate_for_child(self, fd: int) -> int:
        return fd  # DupFd (resource_sharer) hands the child its own copy

    def _launch(self, process_obj: Any) -> None:
        prep_data = spawn.get_preparation_data(process_obj._name)
        buf = io.BytesIO()
        context.set_spawning_popen(self)  # type: ignore[arg-type]
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            context.set_spawning_popen(None)
        child = self._child
        self.pid, self.sentinel = child.pid, child.sentinel
        self.finalizer = util.Finalize(self, util.close_fds, (child.sentinel,))  # type: ignore[attr-defined]
        with open(child.to_child, "wb", closefd=True) as to_child:
            late_env = json.dumps({k: os.environ.get(k) for k in _LATE_ENV}).encode()
            to_child.write(b"G" + struct.pack("<I", len(late_env)) + late_env)
            to_child.write(buf.getbuffer())


class WarmSpawnProcess(context.SpawnProcess):
    _start_method = "spawn"
    _warm_kind = "engine"

    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        child = _take(process_obj._warm_kind)
        if child is None:
            return _SpawnPopen(process_obj)
        try:
            return _WarmPopen(process_obj, child)
        except BrokenPipeError:  # it died between the check and the write
            return _SpawnPopen(process_obj)


class WarmApiServerProcess(WarmSpawnProcess):
    _warm_kind = "api_server"


class WarmSpawnContext(context.SpawnContext):
    Process = WarmSpawnProcess


class WarmApiServerContext(context.SpawnContext):
    Process = WarmApiServerProcess


WARM_SPAWN_CONTEXT = WarmSpawnContext()
WARM_API_SERVER_CONTEXT = WarmApiServerContext()


def _child_main(pipe_handle: int, tracker_fd: int, sys_path: list[str], kind: str) -> None:
    """The pre-started interpreter: import, wait, then run as spawn's child."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C while waiting is the parent's
    sys.path[:] = sys_path
    import importlib

    for name in _PRELOAD[kind]:
        # An import that fails here fails again in the run, which reports it.
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    if os.read(pipe_handle, 1) != b"G":
        os._exit(0)  # the parent exited without work for us
    (size,) = struct.unpack("<I", _read_exactly(pipe_handle, 4))
    for key, value in json.loads(_read_exactly(pipe_handle, size)).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from multiprocessing import resource_tracker

    resource_tracker._resource_tracker._fd = tracker_fd  # type: ignore[attr-defined]
    sys.exit(spawn._main(pipe_handle, os.dup(pipe_handle)))  # type: ignore[attr-defined]


def _read_exactly(fd: int, size: int) -> bytes:
    """`size` bytes of the pipe, unbuffered (spawn's reader takes the rest)."""
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            os._exit(0)  # the parent died while handing over the work
        data += chunk
    return data
