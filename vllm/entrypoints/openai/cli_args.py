"""Flags of the OpenAI-compatible server (upstream:
vllm/entrypoints/openai/cli_args.py). Engine flags come from
`AsyncEngineArgs`; these are the front end's own."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

import vllm.envs as envs
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.openai.embedding_model import (
    add_embedding_model_args,
    validate_embedding_model_args,
)
from vllm.entrypoints.openai.serving_models import LoRAModulePath


class LoRAParserAction(argparse.Action):
    """`--lora-modules` entries: `name=path`, or JSON
    `{"name": ..., "path": ..., "base_model_name": ...}` (or a JSON list of
    such objects). A malformed entry is an argparse error naming the flag."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        if isinstance(values, str):
            values = [values]
        modules: list[LoRAModulePath] = []
        for item in values or ():
            if not item:
                continue
            if "=" in item and "," not in item and not item.lstrip().startswith(("{", "[")):
                name, _, path = item.partition("=")
                if not name or not path:
                    parser.error(f"Invalid --lora-modules entry (expected name=path): {item}")
                modules.append(LoRAModulePath(name, path))
                continue
            modules += _lora_modules_from_json(parser, item)
        setattr(namespace, self.dest, modules)


def _lora_modules_from_json(parser: argparse.ArgumentParser, item: str) -> list[LoRAModulePath]:
    try:
        loaded = json.loads(item)
    except json.JSONDecodeError:
        parser.error(f"Invalid JSON format for --lora-modules: {item}")
    entries = loaded if isinstance(loaded, list) else [loaded]
    modules = []
    for entry in entries:
        try:
            if not isinstance(entry, dict):
                raise TypeError("expected a JSON object")
            module = LoRAModulePath(**entry)
        except TypeError as e:
            parser.error(f"Invalid fields for --lora-modules: {item} - {e}")
        bad = [
            name
            for name, types in _FIELD_TYPES.items()
            if not isinstance(getattr(module, name), types)
            or (name in ("name", "path") and not getattr(module, name))
        ]
        if bad:
            parser.error(f"Invalid fields for --lora-modules: {item} - bad value of {bad[0]!r}")
        modules.append(module)
    return modules


# What each LoRAModulePath field accepts from JSON.
_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "path": str,
    "base_model_name": (str, type(None)),
    "is_3d_lora_weight": bool,
}


def _add_frontend_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Frontend")
    group.add_argument(
        "--host", type=str, default=None, help="Host name to bind (default: every interface)."
    )
    group.add_argument("--port", type=int, default=8000, help="Port number.")
    group.add_argument(
        "--uvicorn-log-level",
        type=str,
        default="info",
        choices=["debug", "info", "warning", "error", "critical", "trace"],
        help="Log level for uvicorn.",
    )
    group.add_argument(
        "--disable-uvicorn-access-log", action="store_true", help="Disable uvicorn access log."
    )
    group.add_argument(
        "--allowed-origins",
        type=json.loads,
        default=["*"],
        help="CORS allowed origins (JSON list).",
    )
    group.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials.")
    group.add_argument(
        "--allowed-methods",
        type=json.loads,
        default=["*"],
        help="CORS allowed methods (JSON list).",
    )
    group.add_argument(
        "--allowed-headers",
        type=json.loads,
        default=["*"],
        help="CORS allowed headers (JSON list).",
    )
    group.add_argument(
        "--api-key",
        type=str,
        nargs="+",
        default=None,
        help="If given, every route that runs the model (all but "
        "/health, /ping, /version, the API docs and the playground's static "
        "page) requires one of these "
        "keys as `Authorization: Bearer <key>`. Also VLLM_API_KEY.",
    )
    group.add_argument(
        "--chat-template",
        type=str,
        default=None,
        help="Chat template: a file path or the template itself (default: the tokenizer's).",
    )
    group.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="Honour a `chat_template` sent in a request (untrusted "
        "templates are refused by default).",
    )
    _add_tool_and_reasoning_args(group)
    group.add_argument(
        "--lora-modules",
        type=str,
        nargs="+",
        default=None,
        action=LoRAParserAction,
        help="LoRA adapters to serve, loaded at start-up (needs --enable-lora): "
        '\'name=path\', or JSON \'{"name": ..., "path": ..., '
        '"base_model_name": ...}\'. A request selects one with `model: name`; '
        "/v1/models lists them with `parent` (their base model).",
    )
    group.add_argument(
        "--response-role",
        type=str,
        default="assistant",
        help="Role of generated chat messages (with add_generation_prompt).",
    )
    group.add_argument(
        "--root-path",
        type=str,
        default=None,
        help="FastAPI root_path when behind a path-based proxy.",
    )
    group.add_argument(
        "--enable-force-include-usage",
        action="store_true",
        help="Send usage in every stream, as if include_usage were set.",
    )
    group.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="Report prompt_tokens_details.cached_tokens in usage.",
    )
    group.add_argument(
        "--max-num-queued-reqs",
        type=int,
        default=None,
        help="Most unfinished requests (n counts n) before new ones get 503 "
        "with Retry-After. Default: 8 x max_num_seqs.",
    )
    group.add_argument(
        "--shutdown-timeout",
        type=float,
        default=0.0,
        help="On SIGTERM/SIGINT, seconds to let in-flight requests finish before they are aborted.",
    )
    group.add_argument(
        "--max-request-body-bytes",
        type=int,
        default=None,
        help="Largest request body accepted, in bytes; a larger one gets 413 "
        "before it is read (a declared Content-Length) or as soon as it "
        "passes the limit (a chunked body). Default: max(16 MiB, 128 x "
        "max_model_len), room for a full-context prompt; raise it for "
        "batched completions of many long prompts.",
    )
    group.add_argument(
        "--disable-fastapi-docs",
        action="store_true",
        help="Disable /docs, /redoc and /openapi.json.",
    )
    group.add_argument(
        "--disable-playground",
        action="store_true",
        help="Do not serve the browser playground and engine dashboard at / "
        "(static files; with --api-key the page loads but every call it "
        "makes needs the key).",
    )


def _add_tool_and_reasoning_args(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='Let the model choose its tool calls (`tool_choice: "auto"`, the '
        "default when a request has tools); needs --tool-call-parser.",
    )
    group.add_argument(
        "--tool-call-parser",
        type=str,
        default=None,
        help="The parser that turns the model's text into tool calls for "
        '`tool_choice: "auto"` (hermes, llama3_json, mistral, pythonic, '
        "qwen3_xml, qwen3_coder, deepseek_v3, granite, or one a "
        "--tool-parser-plugin registers).",
    )
    group.add_argument(
        "--tool-parser-plugin",
        type=str,
        default="",
        help="A Python file that registers more tool parsers "
        "(@ToolParserManager.register_module(name)); its names work with --tool-call-parser.",
    )
    group.add_argument(
        "--exclude-tools-when-tool-choice-none",
        action="store_true",
        help='Do not render the tools into the prompt when `tool_choice` is "none".',
    )


def make_arg_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the server's flags and every engine flag to `parser`."""
    parser.add_argument(
        "model_tag",
        type=str,
        nargs="?",
        default=None,
        help="The model path (default: the embedded SmolLM2 model).",
    )
    parser.add_argument(
        "--headless",
        action="store_true",
        default=False,
        help="Run only the engine cores of this node's data-parallel ranks, no "
        "API server: a secondary node of multi-node data parallelism, which "
        "connects to the head node at --data-parallel-address / "
        "--data-parallel-rpc-port.",
    )
    parser.add_argument(
        "--api-server-count",
        "-asc",
        type=int,
        default=None,
        help="How many API server processes to run; they share the port and "
        "all talk to the engine cores. Default: the data-parallel size (1 "
        "with an external load balancer, the local size in hybrid mode).",
    )
    _add_frontend_args(parser)
    AsyncEngineArgs.add_cli_args(parser)
    add_embedding_model_args(parser)
    return parser


def validate_parsed_serve_args(args: argparse.Namespace) -> None:
    """Quick checks of the parsed flags (errors are argparse-style ValueErrors)."""
    if getattr(args, "model_tag", None):
        if args.model != AsyncEngineArgs.model and args.model != args.model_tag:
            raise ValueError(
                "The model is given twice (positional and --model) with "
                f"different values: {args.model_tag!r} vs {args.model!r}"
            )
        args.model = args.model_tag
    if args.max_num_queued_reqs is not None and args.max_num_queued_reqs < 1:
        raise ValueError("--max-num-queued-reqs must be at least 1")
    if args.max_request_body_bytes is not None and args.max_request_body_bytes < 1:
        raise ValueError("--max-request-body-bytes must be at least 1")
    if args.shutdown_timeout < 0:
        raise ValueError("--shutdown-timeout must be >= 0")
    validate_api_server_count(args)
    validate_parser_args(args)
    validate_lora_modules(args)
    validate_embedding_model_args(args)


def validate_api_server_count(args: argparse.Namespace) -> None:
    """--api-server-count: at least 1, not with --headless, and (above 1)
    nothing that lives in one API server's memory only.

    Deviation from upstream: there `--api-server-count 0` without
    --headless silently runs the engines headless (waiting for a remote
    front end); here it is refused, pointing at --headless.
    """
    count = args.api_server_count
    if args.headless:
        if count is not None and count > 0:
            raise ValueError(
                f"--api-server-count={count} cannot be used with --headless "
                "(no API servers are started in headless mode)."
            )
        return
    if count is None:
        return
    if count < 1:
        raise ValueError(
            f"--api-server-count must be at least 1, got {count} "
            "(to run only the engine cores, use --headless)"
        )
    if count == 1:
        return
    if getattr(args, "embedding_model", None) is not None:
        raise ValueError("--api-server-count > 1 cannot be used with --embedding-model")
    if envs.VLLM_ALLOW_RUNTIME_LORA_UPDATING:
        raise ValueError(
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING cannot be used with --api-server-count > 1"
        )


def validate_lora_modules(args: argparse.Namespace) -> None:
    """--lora-modules needs --enable-lora, one name per adapter, none a served
    model name, and a base_model_name (if given) that is one."""
    modules = args.lora_modules or []
    if modules and not getattr(args, "enable_lora", False):
        raise ValueError("--lora-modules needs --enable-lora")
    served = args.served_model_name or [args.model]
    served = [served] if isinstance(served, str) else list(served)
    names = [m.name for m in modules]
    for module in modules:
        if names.count(module.name) > 1:
            raise ValueError(f"--lora-modules: the adapter name {module.name!r} is given twice")
        if module.name in served:
            raise ValueError(
                f"--lora-modules: the adapter name {module.name!r} is a served model name"
            )
        if module.base_model_name is not None and module.base_model_name not in served:
            raise ValueError(
                f"--lora-modules: the base_model_name {module.base_model_name!r} of adapter "
                f"{module.name!r} is not a served model name (served: {', '.join(served)})"
            )


def validate_parser_args(args: argparse.Namespace) -> None:
    """Load the parser plugins, then check the parser names (upstream's
    start-up errors: auto tool choice without a parser; an unknown name, with
    the registered ones)."""
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise ValueError("--enable-auto-tool-choice requires --tool-call-parser")
    for plugin, load in (
        (args.tool_parser_plugin, ToolParserManager.import_tool_parser),
        (args.reasoning_parser_plugin, ReasoningParserManager.import_reasoning_parser),
    ):
        if not plugin:
            continue
        try:
            load(plugin)
        except Exception as e:
            raise ValueError(f"cannot load the parser plugin {plugin!r}: {e}") from e
    tool_parsers = ToolParserManager.list_registered()
    if args.tool_call_parser and args.tool_call_parser not in tool_parsers:
        raise ValueError(
            f"invalid tool call parser: {args.tool_call_parser} "
            f"(chose from {{ {','.join(tool_parsers)} }})"
        )
    reasoning_parsers = ReasoningParserManager.list_registered()
    if args.reasoning_parser and args.reasoning_parser not in reasoning_parsers:
        raise ValueError(
            f"invalid reasoning parser: {args.reasoning_parser} "
            f"(chose from {{ {','.join(reasoning_parsers)} }})"
        )
