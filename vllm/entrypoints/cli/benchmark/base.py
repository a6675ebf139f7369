"""Base of the `vllm bench` subcommands (upstream: vllm/entrypoints/cli/benchmark/base.py)."""

from __future__ import annotations

import argparse

from vllm.entrypoints.cli.types import CLISubcommand


class BenchmarkSubcommandBase(CLISubcommand):
    """One `vllm bench <name>` benchmark."""

    help: str

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        """Add the benchmark's flags."""
        raise NotImplementedError
