"""Base of the `vllm` CLI's subcommands (upstream: vllm/entrypoints/cli/types.py)."""

from __future__ import annotations

import argparse


class CLISubcommand:
    """One `vllm <name>` subcommand."""

    name: str

    @staticmethod
    def cmd(args: argparse.Namespace) -> None:
        """Run the subcommand."""
        raise NotImplementedError

    def validate(self, args: argparse.Namespace) -> None:
        """Check the parsed arguments before `cmd` runs."""

    def subparser_init(self, subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
        """Register and return this subcommand's parser."""
        raise NotImplementedError
