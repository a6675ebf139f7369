"""How the `vllm` program ends (vllm/entrypoints/cli/main.py:main without
argv): the exit status a normal exit would give, atexit hooks run, and the
interpreter's module teardown skipped (its GC over torch's heap cost ~1 s per
stopped server). Each case runs the program in a subprocess with an atexit
hook and an object with a finalizer inside a reference cycle: only the
teardown's garbage collection would ever run that finalizer."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.entrypoints.openai.conftest import REPO_ROOT
from vllm.version import __version__

_PROGRAM = textwrap.dedent(
    """
    import atexit, sys

    class Cyclic:
        def __init__(self):
            self.me = self

        def __del__(self):
            print("teardown-gc-ran", flush=True)

    kept = Cyclic()  # garbage only once teardown clears this module
    atexit.register(lambda: print("atexit-hook-ran", flush=True))
    from vllm.entrypoints.cli.main import main
    sys.argv = ["vllm", *sys.argv[1:]]
    {call}
    """
)


def _run(argv: list[str], call: str = "main()") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _PROGRAM.format(call=call), *argv],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("argv", "status", "stdout", "stderr"),
    [
        (["--version"], 0, __version__, ""),  # argparse's SystemExit(0)
        (["bench", "no-such-bench"], 2, "", "invalid choice"),  # parser.error
        (["serve", "m", "--api-server-count", "0"], 1, "", "must be at least 1"),  # str
    ],
)
def test_program_exit_status_hooks_and_no_teardown(argv, status, stdout, stderr):
    proc = _run(argv)
    assert proc.returncode == status, proc.stderr[-2000:]
    assert stdout in proc.stdout
    assert stderr in proc.stderr
    assert "atexit-hook-ran" in proc.stdout
    assert "teardown-gc-ran" not in proc.stdout


def test_a_call_with_argv_is_a_plain_call():
    """main(argv) inside a program of its own raises SystemExit as before:
    that program's own exit (teardown included) is unchanged."""
    call = "try:\n    main(['--version'])\nexcept SystemExit as e:\n    print('raised', e.code)"
    proc = _run([], call=call)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "raised 0" in proc.stdout
    assert "atexit-hook-ran" in proc.stdout
    assert "teardown-gc-ran" in proc.stdout
