"""Environment variables vLLM reads, in one typed place (upstream: vllm/envs.py).

Read these at the edges (start-up, executor, server), never inside the
scheduler or the KV-cache allocator. Access as ``vllm.envs.NAME``: each read
evaluates the variable now, so tests can monkeypatch the environment.

Not every read goes through here yet: `VLLM_XGRAMMAR_CACHE_MB`
(v1/structured_output/backend_xgrammar.py), `VLLM_CPU_DISABLE_CUSTOM_OPS` and
`VLLM_CUDA_DISABLE_CUSTOM_OPS` (_custom_ops.py), `VLLM_LOGGING_LEVEL`
(logger.py) and `PYTHONHASHSEED` (v1/core/kv_cache_utils.py) are read with
`os.environ` / `os.getenv` where they are used.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def _tri_state(name: str) -> Callable[[], bool | None]:
    def get() -> bool | None:
        v = os.environ.get(name)
        if v is None or v == "":
            return None
        return v.strip().lower() in ("1", "true", "yes")

    return get


def _bool(name: str, default: str) -> Callable[[], bool]:
    return lambda: os.environ.get(name, default).strip().lower() in ("1", "true", "yes")


def _opt_int(name: str) -> Callable[[], int | None]:
    def get() -> int | None:
        v = os.environ.get(name)
        return int(v) if v not in (None, "") else None

    return get


def _choice(name: str, default: str, choices: tuple[str, ...]) -> Callable[[], str]:
    def get() -> str:
        v = os.environ.get(name, default).strip().lower() or default
        if v not in choices:
            raise ValueError(f"{name}={v!r}: expected one of {', '.join(choices)}.")
        return v

    return get


environment_variables: dict[str, Callable[[], Any]] = {
    # Tri-state: unset -> None (the config decides), "0" -> V1, "1" -> V2.
    "VLLM_USE_V2_MODEL_RUNNER": _tri_state("VLLM_USE_V2_MODEL_RUNNER"),
    # KV cache size on CPU, in GiB (upstream's CPU knob).
    "VLLM_CPU_KVCACHE_SPACE": _opt_int("VLLM_CPU_KVCACHE_SPACE"),
    # KV cache events carry block hashes as 64-bit ints (1) or raw bytes (0).
    "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": _bool("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1"),
    # Run the engine core in its own process (the multiprocess clients).
    "VLLM_ENABLE_V1_MULTIPROCESSING": _bool("VLLM_ENABLE_V1_MULTIPROCESSING", "1"),
    # How engine cores, workers and the DP coordinator are started: spawn, or
    # fork (the child inherits the parent's imports: seconds faster; upstream's
    # default, not ours yet: the LoRA and sampling tests with the engine core
    # in its own process failed forked).
    "VLLM_WORKER_MULTIPROC_METHOD": _choice(
        "VLLM_WORKER_MULTIPROC_METHOD", "spawn", ("fork", "spawn")
    ),
    "VLLM_LOGGING_LEVEL": lambda: os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper(),
    "VLLM_ATTENTION_BACKEND": lambda: os.environ.get("VLLM_ATTENTION_BACKEND") or None,
    "VLLM_API_KEY": lambda: os.environ.get("VLLM_API_KEY") or None,
    "VLLM_HOST_IP": lambda: os.environ.get("VLLM_HOST_IP", ""),
    # Milliseconds an engine-core RPC may take before the client gives up.
    "VLLM_RPC_TIMEOUT": lambda: int(os.environ.get("VLLM_RPC_TIMEOUT", "10000")),
    "VLLM_CPU_OMP_THREADS_BIND": lambda: os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
    # Which build of the CPU ops to load (vllm/_custom_ops.py): "auto" (the
    # best the CPU supports), or avx512_bf16 / avx512 / avx2 / scalar (ours).
    "VLLM_CPU_ISA": lambda: os.environ.get("VLLM_CPU_ISA", "auto").strip().lower() or "auto",
    # The GEMM of unquantized CPU linears (ours; model_executor/layers/utils.py):
    # "auto" (the panel GEMM of csrc/cpu/gemm_panel.cpp where the AVX2 build
    # of the ops runs, else oneDNN), "panel" or "onednn".
    "VLLM_CPU_GEMM": _choice("VLLM_CPU_GEMM", "auto", ("auto", "panel", "onednn")),
    # Engine-core outputs AsyncLLM's output handler processes before yielding
    # to the event loop (keeps the server responsive under large batches).
    "VLLM_V1_OUTPUT_PROC_CHUNK_SIZE": lambda: int(
        os.environ.get("VLLM_V1_OUTPUT_PROC_CHUNK_SIZE", "128")
    ),
    # Keep the API server up (answering 503 / 500) after the engine core died.
    "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": _bool("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "0"),
    # Seconds to wait for the engine core's READY at start-up.
    "VLLM_ENGINE_READY_TIMEOUT_S": lambda: int(
        os.environ.get("VLLM_ENGINE_READY_TIMEOUT_S", "600")
    ),
    # Seconds an idle HTTP keep-alive connection stays open.
    "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": lambda: int(
        os.environ.get("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "5")
    ),
    # Register the operator routes of `vllm serve` (/sleep, /wake_up,
    # /is_sleeping, /reset_prefix_cache, /collective_rpc): never on a public server.
    "VLLM_SERVER_DEV_MODE": _bool("VLLM_SERVER_DEV_MODE", "0"),
    # /v1/responses keeps responses (for GET, previous_response_id and
    # background mode) only with this set; off, `store` is ignored (upstream).
    "VLLM_ENABLE_RESPONSES_API_STORE": _bool("VLLM_ENABLE_RESPONSES_API_STORE", "0"),
    # Most responses that store keeps; beyond it the oldest finished one is
    # evicted (ours: upstream's store grows without bound).
    "VLLM_RESPONSES_API_STORE_MAX_ENTRIES": lambda: int(
        os.environ.get("VLLM_RESPONSES_API_STORE_MAX_ENTRIES", "1024")
    ),
    # Register POST /v1/load_lora_adapter and /v1/unload_lora_adapter (LoRA
    # adapters loaded and unloaded while the server runs); "1" or "true".
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": lambda: (
        os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0").strip().lower() in ("1", "true")
    ),
    # prometheus_client's multiprocess directory (read by prometheus_client
    # itself too): set by `vllm serve --api-server-count N > 1` for its API
    # servers (vllm/v1/metrics/prometheus.py), or by the user.
    "PROMETHEUS_MULTIPROC_DIR": lambda: os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None,
}


def __getattr__(name: str) -> Any:
    if name in environment_variables:
        return environment_variables[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return list(environment_variables)
