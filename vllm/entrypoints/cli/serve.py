"""`vllm serve [model]` (upstream: vllm/entrypoints/cli/serve.py).

The OpenAI-compatible API server is not built yet. Until it is, `vllm serve`
loads the model with the same engine flags and runs a short offline demo
(a few greedy completions through `LLM`), and says plainly that no server is
listening.
"""
from __future__ import annotations

import argparse

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.cli.types import CLISubcommand
from vllm.logger import init_logger

logger = init_logger(__name__)

DEMO_PROMPTS = [
    "The capital of France is",
    "The three primary colors are",
    "def fibonacci(n):",
]


class ServeSubcommand(CLISubcommand):
    """Serve a model (for now: an offline demo of it)."""

    name = "serve"

    @staticmethod
    def cmd(args: argparse.Namespace) -> None:
        if getattr(args, "model_tag", None):
            args.model = args.model_tag
        run_offline_demo(args)

    def subparser_init(self, subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
        parser = subparsers.add_parser(
            self.name, help="Start the vLLM OpenAI-compatible server (not built yet: runs "
            "an offline demo).", usage="vllm serve [model_tag] [options]")
        parser.add_argument("model_tag", type=str, nargs="?", default=None,
                            help="The model path (default: the embedded SmolLM2 model).")
        parser.add_argument("--host", type=str, default=None, help="Host name.")
        parser.add_argument("--port", type=int, default=8000, help="Port number.")
        parser.add_argument("--max-tokens", type=int, default=32,
                            help="Demo only: tokens to generate per prompt.")
        AsyncEngineArgs.add_cli_args(parser)
        return parser


def run_offline_demo(args: argparse.Namespace) -> None:
    import dataclasses

    from vllm import LLM, SamplingParams

    where = f"{args.host or '0.0.0.0'}:{args.port}"
    banner = ("The OpenAI-compatible API server is not built yet: nothing is listening on "
              f"{where}. Running an offline LLM demo with the same engine flags instead.")
    print(banner, flush=True)
    engine_args = AsyncEngineArgs.from_cli_args(args)
    fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)} - {"enable_log_requests"}
    llm = LLM(**{k: v for k, v in dataclasses.asdict(engine_args).items() if k in fields})
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    for output in llm.generate(DEMO_PROMPTS, params, use_tqdm=False):
        print(f"Prompt: {output.prompt!r}\nGenerated: {output.outputs[0].text!r}\n", flush=True)
    print("Demo done. (`vllm serve` will start the server once it is built.)", flush=True)


def cmd_init() -> list[CLISubcommand]:
    return [ServeSubcommand()]
