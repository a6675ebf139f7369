"""`vllm serve [model]` (upstream: vllm/entrypoints/cli/serve.py): the
OpenAI-compatible API server. Without a model it serves the embedded
default model."""

from __future__ import annotations

import argparse
import asyncio
import sys

from vllm.entrypoints.cli.types import CLISubcommand
from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.logger import init_logger

logger = init_logger(__name__)


class ServeSubcommand(CLISubcommand):
    """The `serve` subcommand for the vLLM CLI."""

    name = "serve"

    @staticmethod
    def cmd(args: argparse.Namespace) -> None:
        from vllm.entrypoints.openai.api_server import run_server

        try:
            asyncio.run(run_server(args))
        except KeyboardInterrupt:
            logger.info("Interrupted during start-up; exiting.")
            sys.exit(130)

    def validate(self, args: argparse.Namespace) -> None:
        try:
            validate_parsed_serve_args(args)
        except ValueError as e:
            raise SystemExit(f"vllm serve: error: {e}") from None

    def subparser_init(self, subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
        parser = subparsers.add_parser(
            self.name,
            help="Start the vLLM OpenAI Compatible API server.",
            description="Start the vLLM OpenAI Compatible API server.",
            usage="vllm serve [model_tag] [options]",
        )
        return make_arg_parser(parser)


def cmd_init() -> list[CLISubcommand]:
    return [ServeSubcommand()]
