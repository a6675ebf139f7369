"""`vllm run-batch` (upstream: vllm/entrypoints/cli/run_batch.py): run an
OpenAI batch file through an in-process engine
(vllm/entrypoints/openai/run_batch.py)."""

from __future__ import annotations

import argparse
import asyncio

from vllm.entrypoints.cli.types import CLISubcommand
from vllm.logger import init_logger
from vllm.version import __version__

logger = init_logger(__name__)


class RunBatchSubcommand(CLISubcommand):
    """The `run-batch` subcommand for the vLLM CLI."""

    name = "run-batch"

    @staticmethod
    def cmd(args: argparse.Namespace) -> None:
        from vllm.entrypoints.openai.run_batch import main as run_batch_main

        logger.info("vLLM batch processing API version %s", __version__)
        try:
            asyncio.run(run_batch_main(args))
        except ValueError as e:  # an engine flag the config refuses
            raise SystemExit(f"vllm run-batch: error: {e}") from None

    def validate(self, args: argparse.Namespace) -> None:
        from vllm.entrypoints.openai.run_batch import validate_run_batch_args

        try:
            validate_run_batch_args(args)
        except ValueError as e:
            raise SystemExit(f"vllm run-batch: error: {e}") from None

    def subparser_init(self, subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
        from vllm.entrypoints.openai.run_batch import make_arg_parser

        parser = subparsers.add_parser(
            self.name,
            help="Run a batch of requests and write the results to a file.",
            description="Run an OpenAI batch file (JSONL) through vLLM's "
            "OpenAI-compatible handlers. Local input and output files only.",
            usage="vllm run-batch -i INPUT.jsonl -o OUTPUT.jsonl --model <model>",
        )
        return make_arg_parser(parser)


def cmd_init() -> list[CLISubcommand]:
    return [RunBatchSubcommand()]
