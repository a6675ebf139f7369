"""`vllm chat` and `vllm complete` (upstream: vllm/entrypoints/cli/openai.py):
talk to a running OpenAI-compatible server through the `openai` client.

    vllm chat [--url URL] [--model-name NAME] [--api-key KEY]
              [--system-prompt TEXT] [-q MESSAGE] [--stats]
    vllm complete [--url URL] [--model-name NAME] [--api-key KEY]
                  [--max-tokens N] [-q PROMPT] [--stats]

Without `-q` they read one message (chat) or prompt (complete) per line from
stdin after a "> " prompt, stream the answer, and stop at end of input
(Ctrl-D) or Ctrl-C. Chat keeps the conversation (the system prompt, every
message and every answer) and sends all of it each turn. The model defaults
to the first one /v1/models lists; the key to OPENAI_API_KEY (else "EMPTY").

Beyond upstream: a server that cannot be reached, or that refuses a request,
is reported in one line on stderr (exit status 1) instead of a traceback; in
the interactive loop a refused message is dropped from the conversation and
the loop goes on.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from vllm.entrypoints.cli.types import CLISubcommand

if TYPE_CHECKING:
    from openai import OpenAI


def _register_signal_handlers() -> None:
    """Ctrl-C / Ctrl-Z end the session quietly (exit status 0), as upstream."""

    def handler(signum: int, frame: Any) -> None:
        sys.exit(0)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTSTP, handler)


def _interactive_cli(args: argparse.Namespace) -> tuple[str, OpenAI]:
    """The client and the model name (`--model-name`, else the first model the
    server lists)."""
    from openai import OpenAI

    _register_signal_handlers()
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY", "EMPTY")
    client = OpenAI(api_key=api_key, base_url=args.url)
    model_name = args.model_name
    if not model_name:
        models = client.models.list().data
        if not models:
            raise SystemExit(f"Error: the server at {args.url} lists no model")
        model_name = models[0].id
    print(f"Using model: {model_name}")
    return model_name, client


def _print_metrics(start: float, ttft: float | None, completion_tokens: int) -> None:
    total = time.perf_counter() - start
    if ttft is None or total <= 0:
        return
    print(f"{'TTFT:':<5} {ttft * 1000:.2f} ms")
    print(
        f"{'TPS:':<5} {completion_tokens / total:.2f} tokens/s "
        f"({completion_tokens} tokens in {total:.2f}s)"
    )


def _print_stream(stream: Iterable[Any], chat: bool, stats: bool = False) -> str:
    """Print the streamed text as it comes; return all of it. `stats`: then
    TTFT and tokens/s (the usage chunk's completion_tokens)."""
    output = ""
    start = time.perf_counter()
    ttft: float | None = None
    completion_tokens = 0
    for chunk in stream:
        if chunk.usage is not None:
            completion_tokens = chunk.usage.completion_tokens
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        text = choice.delta.content if chat else choice.text
        if text:
            if ttft is None:
                ttft = time.perf_counter() - start
            output += text
            print(text, end="", flush=True)
    print()
    if stats:
        _print_metrics(start, ttft, completion_tokens)
    return output


def _read_lines(banner: str) -> Iterable[str]:
    """Lines typed after a "> " prompt, until end of input."""
    print(banner)
    while True:
        try:
            yield input("> ")
        except EOFError:
            return


def _api_errors() -> tuple[type[Exception], ...]:
    import openai

    return (openai.APIError,)


def _fail(e: Exception) -> None:
    print(f"Error: {e}", file=sys.stderr)
    sys.exit(1)


class _ServerQueryCommand(CLISubcommand):
    """What `chat` and `complete` share: an API error ends the command with
    "Error: ..." and status 1; `help` and `usage` fill the subparser;
    `add_cli_args` and `_run` are each command's own."""

    help = ""
    usage = ""

    @classmethod
    def cmd(cls, args: argparse.Namespace) -> None:  # type: ignore[override]
        try:
            cls._run(args)
        except _api_errors() as e:
            _fail(e)

    @staticmethod
    def _run(args: argparse.Namespace) -> None:
        raise NotImplementedError

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        raise NotImplementedError

    def subparser_init(self, subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
        parser = subparsers.add_parser(
            self.name, help=self.help, description=self.help, usage=self.usage
        )
        return self.add_cli_args(parser)


class ChatCommand(_ServerQueryCommand):
    """The `chat` subcommand for the vLLM CLI."""

    name = "chat"
    help = "Generate chat completions via the running API server."
    usage = "vllm chat [options]"

    @staticmethod
    def _run(args: argparse.Namespace) -> None:
        model_name, client = _interactive_cli(args)
        conversation: list[Any] = []
        if args.system_prompt is not None:
            conversation.append({"role": "system", "content": args.system_prompt})
        kwargs: dict[str, Any] = {"model": model_name, "stream": True}
        if args.stats:
            kwargs["stream_options"] = {"include_usage": True}

        def turn(message: str) -> None:
            conversation.append({"role": "user", "content": message})
            stream = client.chat.completions.create(messages=conversation, **kwargs)
            output = _print_stream(stream, chat=True, stats=args.stats)
            conversation.append({"role": "assistant", "content": output})

        if args.quick is not None:
            turn(args.quick)
            return
        for message in _read_lines("Please enter a message for the chat model:"):
            try:
                turn(message)
            except _api_errors() as e:
                # The refused message leaves the conversation; the session goes on.
                del conversation[-1]
                print(f"\nError: {e}", file=sys.stderr, flush=True)

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        _add_query_options(parser)
        parser.add_argument(
            "--system-prompt",
            type=str,
            default=None,
            help="The system prompt put first in the conversation (for models "
            "whose chat template takes one).",
        )
        parser.add_argument(
            "-q",
            "--quick",
            type=str,
            metavar="MESSAGE",
            help="Send MESSAGE alone, print the answer, then exit.",
        )
        _add_stats(parser)
        return parser


class CompleteCommand(_ServerQueryCommand):
    """The `complete` subcommand for the vLLM CLI."""

    name = "complete"
    help = "Generate text completions of a prompt via the running API server."
    usage = "vllm complete [options]"

    @staticmethod
    def _run(args: argparse.Namespace) -> None:
        model_name, client = _interactive_cli(args)
        kwargs: dict[str, Any] = {"model": model_name, "stream": True}
        if args.max_tokens:
            kwargs["max_tokens"] = args.max_tokens
        if args.stats:
            kwargs["stream_options"] = {"include_usage": True}

        def complete(prompt: str) -> None:
            stream = client.completions.create(prompt=prompt, **kwargs)
            _print_stream(stream, chat=False, stats=args.stats)

        if args.quick is not None:
            complete(args.quick)
            return
        for prompt in _read_lines("Please enter prompt to complete:"):
            try:
                complete(prompt)
            except _api_errors() as e:
                print(f"\nError: {e}", file=sys.stderr, flush=True)

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        _add_query_options(parser)
        parser.add_argument(
            "--max-tokens",
            type=int,
            help="Maximum number of tokens to generate per output sequence.",
        )
        parser.add_argument(
            "-q",
            "--quick",
            type=str,
            metavar="PROMPT",
            help="Send PROMPT alone, print the completion, then exit.",
        )
        _add_stats(parser)
        return parser


def _add_query_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        type=str,
        default="http://localhost:8000/v1",
        help="URL of the running OpenAI-compatible API server.",
    )
    parser.add_argument(
        "--model-name",
        type=str,
        default=None,
        help="The model to ask (default: the first model /v1/models lists).",
    )
    parser.add_argument(
        "--api-key",
        type=str,
        default=None,
        help="API key sent as `Authorization: Bearer KEY` (default: OPENAI_API_KEY).",
    )


def _add_stats(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--stats",
        action="store_true",
        help="Print TTFT and tokens/s after each response.",
    )


def cmd_init() -> list[CLISubcommand]:
    return [ChatCommand(), CompleteCommand()]
