"""A second, pooling model in the same `vllm serve` (beyond upstream; issue 17).

    vllm serve GEN --embedding-model EMB [--embedding-served-model-name NAME]

starts two AsyncLLMs in the server process, each with its own engine-core
process and its own KV-cache budget: GEN (the main model, which must be
generative) serves chat, completions, responses, messages and tokenize; EMB
runs with `runner="pooling"` and serves the pooling routes (/v1/embeddings,
/pooling, /classify, ... per its pooler's tasks). /v1/models lists both, each
card with its `supported_tasks`; a request naming one model on the other's
route is a 400 (`OpenAIServingModels.wrong_api_message`).

Flags: the engine flags (--dtype, --max-model-len, --kv-cache-memory-bytes,
...) configure GEN only. EMB takes its own from the `--embedding-*` variants in
EMBEDDING_ENGINE_FLAGS (engine defaults when absent) and shares only the
process-wide ones in SHARED_ENGINE_FIELDS. --chat-template is GEN's; EMB's
`messages` inputs use --embedding-chat-template, else its tokenizer's
(--trust-request-chat-template applies to both). VLLM_CPU_KVCACHE_SPACE, an
environment variable, sizes the KV cache of each engine whose bytes flag is
unset. Refused with --embedding-model: parallelism > 1 (the two-engine layout
is built for one device) and --runner pooling (the main model must generate).

Not covered: /metrics and the periodic stats log report GEN only (the
embedding engine runs without stat loggers: a second Prometheus logger would
replace the first one's `vllm:` collectors); the dev routes (sleep, reset
prefix cache) act on GEN.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs
from vllm.engine.protocol import EngineClient
from vllm.entrypoints.launcher import WATCHDOG_INTERVAL_S, terminate_if_errored
from vllm.usage.usage_lib import UsageContext
from vllm.utils.argparse_utils import human_readable_int, json_dict

if TYPE_CHECKING:
    from vllm.config import ModelConfig, VllmConfig
    from vllm.v1.engine.async_llm import AsyncLLM

# `--embedding-X` flag (argparse dest) -> the EngineArgs field it sets on the
# embedding engine.
EMBEDDING_ENGINE_FLAGS = {
    "embedding_served_model_name": "served_model_name",
    "embedding_dtype": "dtype",
    "embedding_max_model_len": "max_model_len",
    "embedding_max_num_seqs": "max_num_seqs",
    "embedding_kv_cache_memory_bytes": "kv_cache_memory_bytes",
    "embedding_gpu_memory_utilization": "gpu_memory_utilization",
    "embedding_pooler_config": "pooler_config",
}
# Engine fields the embedding engine takes from the main flags: one device,
# one download directory and one request-logging switch per server.
SHARED_ENGINE_FIELDS = ("device", "download_dir", "enable_log_requests")
# Main-engine flags that must keep their defaults with --embedding-model.
_SINGLE_DEVICE_FLAGS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
_DTYPES = ["auto", "half", "float16", "bfloat16", "float", "float32"]


def add_embedding_model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "Embedding model",
        "A second, pooling model served by the same server (its own engine). "
        "The engine flags above configure the main model only; the embedding "
        "model takes the --embedding-* ones (engine defaults when absent) and "
        "shares --device, --download-dir and --enable-log-requests.",
    )
    group.add_argument(
        "--embedding-model",
        type=str,
        default=None,
        help="Path of a pooling model to serve next to the main (generative) "
        "one, with runner 'pooling': /v1/embeddings, /pooling, /classify, ... "
        "go to it; chat, completions and tokenize to the main model.",
    )
    group.add_argument(
        "--embedding-served-model-name",
        type=str,
        nargs="+",
        default=None,
        help="Name(s) the API serves the embedding model under (default: its path).",
    )
    group.add_argument("--embedding-dtype", choices=_DTYPES, default=None, help="Its --dtype.")
    group.add_argument(
        "--embedding-max-model-len",
        type=human_readable_int,
        default=None,
        help="Its --max-model-len.",
    )
    group.add_argument(
        "--embedding-max-num-seqs", type=int, default=None, help="Its --max-num-seqs."
    )
    group.add_argument(
        "--embedding-kv-cache-memory-bytes",
        type=human_readable_int,
        default=None,
        help="Its KV-cache budget in bytes (its --kv-cache-memory-bytes; the "
        "main model's budget is --kv-cache-memory-bytes). Encoder-only models "
        "keep no KV cache.",
    )
    group.add_argument(
        "--embedding-gpu-memory-utilization",
        type=float,
        default=None,
        help="GPU only: the fraction of the GPU's memory the embedding engine "
        "may use. It starts after the main engine, so the two fractions must "
        "sum below 1 (lower --gpu-memory-utilization). On a GPU one of this or "
        "--embedding-kv-cache-memory-bytes is required.",
    )
    group.add_argument(
        "--embedding-pooler-config",
        type=json_dict,
        default=None,
        help="Its --pooler-config (JSON).",
    )
    group.add_argument(
        "--embedding-chat-template",
        type=str,
        default=None,
        help="The template of `messages` inputs on its routes: a file path or the "
        "template itself (default: its tokenizer's; --chat-template is the main "
        "model's only).",
    )


def _served_names(served: str | list[str] | None, model: str) -> list[str]:
    return ([served] if isinstance(served, str) else list(served or [])) or [model]


def validate_embedding_model_args(args: argparse.Namespace) -> None:
    """Refuse what the two-engine server does not support (ValueError)."""
    if args.embedding_model is None:
        for dest in [*EMBEDDING_ENGINE_FLAGS, "embedding_chat_template"]:
            if getattr(args, dest) is not None:
                flag = "--" + dest.replace("_", "-")
                raise ValueError(f"{flag} needs --embedding-model")
        return
    for field in _SINGLE_DEVICE_FLAGS:
        if getattr(args, field) != getattr(EngineArgs, field):
            flag = "--" + field.replace("_", "-")
            raise ValueError(
                f"--embedding-model is not supported with {flag} {getattr(args, field)} "
                "(the two engines share one device)"
            )
    if args.runner == "pooling":
        raise ValueError(
            "--embedding-model needs a generative main model; drop --runner pooling "
            "(serve a single pooling model without --embedding-model)"
        )
    main = _served_names(args.served_model_name, args.model)
    embed = _served_names(args.embedding_served_model_name, args.embedding_model)
    if clash := sorted(set(main) & set(embed)):
        raise ValueError(
            f"the main and the embedding model are both served as {clash}: give "
            "--served-model-name or --embedding-served-model-name distinct names"
        )


def embedding_served_names(args: argparse.Namespace) -> list[str]:
    return _served_names(args.embedding_served_model_name, args.embedding_model)


def embedding_engine_args(args: argparse.Namespace) -> AsyncEngineArgs:
    """The embedding engine's arguments: the --embedding-* values, the shared
    fields, engine defaults for the rest."""
    kwargs: dict[str, Any] = {field: getattr(args, field) for field in SHARED_ENGINE_FIELDS}
    for dest, field in EMBEDDING_ENGINE_FLAGS.items():
        if getattr(args, dest) is not None:
            kwargs[field] = getattr(args, dest)
    return AsyncEngineArgs(model=args.embedding_model, runner="pooling", **kwargs)


def check_device_budget(args: argparse.Namespace, device_type: str) -> None:
    """On a GPU the embedding engine needs a budget of its own: by default it
    would ask for the 90 % the main engine already holds."""
    if device_type == "cuda" and (
        args.embedding_gpu_memory_utilization is None
        and args.embedding_kv_cache_memory_bytes is None
    ):
        raise ValueError(
            "--embedding-model on a GPU needs --embedding-gpu-memory-utilization or "
            "--embedding-kv-cache-memory-bytes (with --gpu-memory-utilization lowered "
            "to leave it room)"
        )


def check_main_model(args: argparse.Namespace, model_config: ModelConfig | None) -> None:
    """With --embedding-model the main model must generate (checked on its
    config, before any engine starts)."""
    if getattr(args, "embedding_model", None) is None or model_config is None:
        return
    if model_config.runner_type != "generate":
        raise ValueError(
            f"--embedding-model needs a generative main model; {model_config.model} runs "
            f"with runner {model_config.runner_type!r} (serve it alone instead)"
        )


def start_async_llm(
    vllm_config: VllmConfig,
    args: argparse.Namespace,
    disable_log_stats: bool,
    client_config: dict[str, Any] | None = None,
) -> AsyncLLM:
    """The server's AsyncLLM (engine core in a child process); each of the
    two engines is started this way. With `client_config` (one of several
    API servers) it connects to engine cores that run already."""
    from vllm.v1.engine.async_llm import AsyncLLM

    max_queued = args.max_num_queued_reqs
    if max_queued is None:
        max_queued = 8 * vllm_config.scheduler_config.max_num_seqs
    client_kwargs: dict[str, Any] = {}
    if client_config:
        client_config = dict(client_config)
        client_kwargs = dict(
            client_count=client_config.pop("client_count"),
            client_index=client_config.pop("client_index"),
            client_addresses=client_config,
        )
    return AsyncLLM.from_vllm_config(
        vllm_config,
        usage_context=UsageContext.OPENAI_API_SERVER,
        enable_log_requests=getattr(args, "enable_log_requests", False),
        disable_log_stats=disable_log_stats,
        max_num_queued_reqs=max_queued,
        **client_kwargs,
    )


@asynccontextmanager
async def build_embedding_engine_client(
    args: argparse.Namespace,
) -> AsyncIterator[EngineClient | None]:
    """The --embedding-model engine (None without the flag), started after
    the main one (on a GPU that one has sized its memory by then); shut
    down on exit."""
    if getattr(args, "embedding_model", None) is None:
        yield None
        return
    try:
        engine_args = embedding_engine_args(args)
        vllm_config = engine_args.create_engine_config(UsageContext.OPENAI_API_SERVER)
        check_device_budget(args, vllm_config.device_config.device_type)
    except ValueError as e:
        # The engine's messages name the plain flags: say which engine.
        raise ValueError(f"--embedding-model {args.embedding_model}: {e}") from e
    # No stat loggers: its Prometheus logger would replace the main engine's.
    engine = start_async_llm(vllm_config, args, disable_log_stats=True)
    try:
        yield engine
    finally:
        engine.shutdown()


async def embedding_watchdog(state: Any) -> None:
    """The launcher's watchdog for the second engine: the server stops once
    the embedding engine is dead (unless VLLM_KEEP_ALIVE_ON_ENGINE_DEATH)."""
    while True:
        await asyncio.sleep(WATCHDOG_INTERVAL_S)
        server = getattr(state, "server", None)
        if server is not None:
            terminate_if_errored(server, state.embedding_engine_client)
