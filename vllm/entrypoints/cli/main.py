"""The `vllm` command (upstream: vllm/entrypoints/cli/main.py).

vllm serve [model] [engine flags]      (an offline demo until the server lands)
vllm bench throughput|latency [flags]
"""

from __future__ import annotations

import sys

from vllm.entrypoints.cli.types import CLISubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.version import __version__


def _subcommands() -> list[CLISubcommand]:
    from vllm.entrypoints.cli import serve
    from vllm.entrypoints.cli.benchmark import main as bench

    return [*serve.cmd_init(), *bench.cmd_init()]


def main(argv: list[str] | None = None) -> None:
    parser = FlexibleArgumentParser(
        prog="vllm",
        description="vLLM CLI",
        epilog="For a subcommand's flags: vllm <subcommand> --help",
    )
    parser.add_argument("-v", "--version", action="version", version=__version__)
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    cmds: dict[str, CLISubcommand] = {}
    for cmd in _subcommands():
        cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
        cmds[cmd.name] = cmd
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.subparser in cmds:
        cmds[args.subparser].validate(args)
    if hasattr(args, "dispatch_function"):
        args.dispatch_function(args)
    else:
        parser.print_help()


if __name__ == "__main__":
    main()
