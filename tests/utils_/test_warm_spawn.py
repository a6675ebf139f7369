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
from vllm.utils.warm_spawn import WARM_API_SERVER_CONTEXT, WARM_SPAWN_CONTEXT, prestart_spawn


def _report(conn, value):
    conn.send((os.getpid(), os.environ.get("WARM_SPAWN_TEST"), value, "torch" in sys.modules))
    conn.close()


def _report_kind(conn):
    api_server = "vllm.entrypoints.openai.api_server" in sys.modules
    conn.send((os.getpid(), api_server, os.environ.get("PROMETHEUS_MULTIPROC_DIR")))
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


def _run_report(value, target=_report, context=WARM_SPAWN_CONTEXT):
    reader, writer = context.Pipe(duplex=False)
    proc = context.Process(target=target, args=(writer, *value))
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
    proc, (pid, env, value, preloaded) = _run_report(([1, "x"],))
    assert pid == warm.pid == proc.pid  # the pre-started one, not a new interpreter
    assert (env, value, preloaded) == ("a", [1, "x"], True)
    assert not warm_spawn._ready


def test_changed_environment_starts_cold(monkeypatch):
    prestart_spawn()
    (warm,) = warm_spawn._ready
    monkeypatch.setenv("WARM_SPAWN_TEST", "b")  # after the pre-start
    _, (pid, env, _, _) = _run_report((7,))
    assert pid != warm.pid and env == "b"
    deadline = time.monotonic() + 60
    while psutil.pid_exists(warm.pid) and psutil.Process(warm.pid).status() != "zombie":
        assert time.monotonic() < deadline, "the unused pre-started process did not exit"
        time.sleep(0.1)


def test_each_kind_takes_its_own(monkeypatch):
    """An API server's pre-started child has the server imported; an engine
    start does not take it. PROMETHEUS_MULTIPROC_DIR, set by `vllm serve`
    after the pre-start, does not make the child stale: it gets the value."""
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    prestart_spawn(kind="api_server")
    (warm,) = warm_spawn._ready
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/tmp/metrics-dir")
    _, (pid, api_server, _) = _run_report((), _report_kind)
    assert pid != warm.pid and not api_server  # an engine start: cold
    assert warm_spawn._ready == [warm]
    _, (pid, api_server, metrics_dir) = _run_report((), _report_kind, WARM_API_SERVER_CONTEXT)
    assert (pid, api_server, metrics_dir) == (warm.pid, True, "/tmp/metrics-dir")
    with pytest.raises(ValueError, match="no-such-kind"):
        prestart_spawn(kind="no-such-kind")


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
