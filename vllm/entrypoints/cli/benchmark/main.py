"""`vllm bench <benchmark>` (upstream: vllm/entrypoints/cli/benchmark/main.py)."""

from __future__ import annotations

import argparse

from vllm.entrypoints.cli.benchmark.base import BenchmarkSubcommandBase
from vllm.entrypoints.cli.benchmark.latency import BenchmarkLatencySubcommand
from vllm.entrypoints.cli.benchmark.serve import BenchmarkServingSubcommand
from vllm.entrypoints.cli.benchmark.throughput import BenchmarkThroughputSubcommand
from vllm.entrypoints.cli.types import CLISubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser

BENCHMARKS: list[type[BenchmarkSubcommandBase]] = [
    BenchmarkLatencySubcommand,
    BenchmarkServingSubcommand,
    BenchmarkThroughputSubcommand,
]


class BenchmarkSubcommand(CLISubcommand):
    """The `vllm bench` command: dispatches to one benchmark."""

    name = "bench"
    help = "vLLM benchmark suite."

    @staticmethod
    def cmd(args: argparse.Namespace) -> None:
        args.dispatch_function(args)

    def validate(self, args: argparse.Namespace) -> None:
        pass

    def subparser_init(self, subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
        parser = subparsers.add_parser(
            self.name,
            help=self.help,
            description=self.help,
            usage="vllm bench <bench_type> [options]",
        )
        bench_parsers = parser.add_subparsers(
            required=True, dest="bench_type", parser_class=FlexibleArgumentParser
        )
        for cls in BENCHMARKS:
            sub = bench_parsers.add_parser(
                cls.name,
                help=cls.help,
                description=cls.help,
                usage=f"vllm bench {cls.name} [options]",
            )
            cls.add_cli_args(sub)
            sub.set_defaults(dispatch_function=cls.cmd)
        return parser


def cmd_init() -> list[CLISubcommand]:
    return [BenchmarkSubcommand()]
