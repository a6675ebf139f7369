"""vllm/utils/warm_spawn.py: a pre-started interpreter runs a spawn child's work
(a Connection travels, exit codes and terminate() behave as spawn's), is
skipped when the environment changed, and leaves quietly when its parent exits
without work. Real processes throughout."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from vllm.utils import warm_spawn
from vllm.utils.warm_spawn import WARM_SPAWN_CONTEXT, prestart_spawn


def _report(conn, value):
    conn.send((os.getpid(), os.environ.get("WARM_SPAWN_TEST"), value, "torch" in sys.modules))
    conn.close()


def _exit_with(code):
    sys.exit(code)


def _sleep():
    time.sleep(60)


@pytest.fixture(autouse=True)
def _no_leftovers():
    yield
    while warm_spawn._ready:
        warm_spawn._discard(warm_spawn._ready.pop())


def _run_report(value):
    reader, writer = WARM_SPAWN_CONTEXT.Pipe(duplex=False)
    proc = WARM_SPAWN_CONTEXT.Process(target=_report, args=(writer, value))
    proc.start()
    writer.close()
    assert reader.poll(120)
    result = reader.recv()
    proc.join(30)
    assert proc.exitcode == 0
    return proc, result


def test_prestarted_child_runs_the_work(monkeypatch):
    monkeypatch.setenv("WARM_SPAWN_TEST", "a")
    prestart_spawn()
    (warm,) = warm_spawn._ready
    proc, (pid, env, value, preloaded) = _run_report([1, "x"])
    assert pid == warm.pid == proc.pid  # the pre-started one, not a new interpreter
    assert (env, value, preloaded) == ("a", [1, "x"], True)
    assert not warm_spawn._ready


def test_changed_environment_starts_cold(monkeypatch):
    prestart_spawn()
    (warm,) = warm_spawn._ready
    monkeypatch.setenv("WARM_SPAWN_TEST", "b")  # after the pre-start
    _, (pid, env, _, _) = _run_report(7)
    assert pid != warm.pid and env == "b"
    deadline = time.monotonic() + 60
    while psutil.pid_exists(warm.pid) and psutil.Process(warm.pid).status() != "zombie":
        assert time.monotonic() < deadline, "the unused pre-started process did not exit"
        time.sleep(0.1)


def test_exit_code_and_terminate():
    prestart_spawn()
    proc = WARM_SPAWN_CONTEXT.Process(target=_exit_with, args=(3,))
    proc.start()
    proc.join(120)
    assert proc.exitcode == 3
    prestart_spawn()
    proc = WARM_SPAWN_CONTEXT.Process(target=_sleep)
    proc.start()
    assert proc.is_alive()
    proc.terminate()
    proc.join(30)
    assert proc.exitcode == -15


def test_parent_exit_without_work_is_quiet():
    script = textwrap.dedent(
        """
        from vllm.utils.warm_spawn import _ready, prestart_spawn
        prestart_spawn()
        print(_ready[0].pid, flush=True)
        """
    )
    cmd = [sys.executable, "-c", script]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 90  # it finishes its imports, then reads EOF
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie":
        assert time.monotonic() < deadline, "the pre-started process outlived its parent"
        time.sleep(0.2)
    assert out.stderr == ""
