"""The `vllm` command (upstream: vllm/entrypoints/cli/main.py).

vllm serve [model] [engine flags]      the OpenAI-compatible server
vllm chat | complete [--url URL]       talk to a running server (cli/openai.py)
vllm run-batch -i IN -o OUT --model M  an OpenAI batch file, in process
vllm collect-env                       the environment report
vllm bench throughput|latency|serve [flags]
"""

from __future__ import annotations

import importlib
import sys

from vllm import envs
from vllm.entrypoints.cli.types import CLISubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.version import __version__

# Subcommand -> the module that defines it (under vllm.entrypoints.cli).
_MODULES = {
    "chat": "openai",
    "complete": "openai",
    "serve": "serve",
    "bench": "benchmark.main",
    "collect-env": "collect_env",
    "run-batch": "run_batch",
}


def _subcommands(argv: list[str]) -> list[CLISubcommand]:
    """The subcommands to register: only the one named first in `argv` (so
    that `vllm chat` does not import torch for the engine flags of the
    others), none for `vllm --version`, else all of them (`vllm --help`)."""
    if argv and argv[0] in ("-v", "--version"):
        return []  # argparse prints the version and exits before any command
    names = [_MODULES[argv[0]]] if argv and argv[0] in _MODULES else _MODULES.values()
    modules = [importlib.import_module(f"vllm.entrypoints.cli.{n}") for n in dict.fromkeys(names)]
    return [cmd for module in modules for cmd in module.cmd_init()]


def _maybe_prestart_engine_process(argv: list[str]) -> None:
    """`vllm serve` and `vllm run-batch` start an engine-core process: start its
    interpreter now, so that its imports overlap this process's (about 5 s each
    on a 2-core machine; vllm/utils/warm_spawn.py)."""
    if not argv or argv[0] not in ("serve", "run-batch") or {"-h", "--help"} & set(argv):
        return
    if envs.VLLM_WORKER_MULTIPROC_METHOD != "spawn" or not envs.VLLM_ENABLE_V1_MULTIPROCESSING:
        return
    from vllm.utils.warm_spawn import prestart_spawn

    prestart_spawn()


def main(argv: list[str] | None = None) -> None:
    """`vllm ARGV`. Without `argv` this runs as the program (the `vllm`
    script, `python -m vllm.entrypoints.cli.main`): it reads sys.argv and, once
    the command has returned or exited, ends the process without the
    interpreter's module teardown (`exit_skipping_teardown`: atexit hooks
    still run; a stopped `vllm serve` exits ~1 s sooner). With `argv` it is a
    plain call that returns or raises SystemExit."""
    if argv is not None:
        _run(argv)
        return
    try:
        _run(sys.argv[1:])
    except SystemExit as e:
        code = _exit_status(e.code)
    else:
        code = 0
    from vllm.utils.system_utils import exit_skipping_teardown

    exit_skipping_teardown(code, run_exit_hooks=True)


def _exit_status(code: object) -> int:
    """The status SystemExit(code) gives a normal exit: None -> 0, an int as
    is, anything else printed to stderr -> 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _run(argv: list[str]) -> None:
    parser = FlexibleArgumentParser(
        prog="vllm",
        description="vLLM CLI",
        epilog="For a subcommand's flags: vllm <subcommand> --help",
    )
    parser.add_argument("-v", "--version", action="version", version=__version__)
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    cmds: dict[str, CLISubcommand] = {}
    _maybe_prestart_engine_process(argv)
    for cmd in _subcommands(argv):
        cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
        cmds[cmd.name] = cmd
    args = parser.parse_args(argv)
    if args.subparser in cmds:
        cmds[args.subparser].validate(args)
    if hasattr(args, "dispatch_function"):
        args.dispatch_function(args)
    else:
        parser.print_help()


if __name__ == "__main__":
    main()
