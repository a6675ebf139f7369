"""`vllm collect-env` (upstream: vllm/entrypoints/cli/collect_env.py): print
the environment report of vllm/collect_env.py."""

from __future__ import annotations

import argparse

from vllm.entrypoints.cli.types import CLISubcommand


class CollectEnvSubcommand(CLISubcommand):
    """The `collect-env` subcommand for the vLLM CLI."""

    name = "collect-env"

    @staticmethod
    def cmd(args: argparse.Namespace) -> None:
        from vllm.collect_env import main as collect_env_main

        collect_env_main()

    def subparser_init(self, subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
        return subparsers.add_parser(
            self.name,
            help="Print information about the environment (for bug reports).",
            description="Print information about the environment (for bug reports).",
            usage="vllm collect-env",
        )


def cmd_init() -> list[CLISubcommand]:
    return [CollectEnvSubcommand()]
