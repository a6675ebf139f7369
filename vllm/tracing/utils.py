"""Span attribute names and W3C trace-context headers (upstream: vllm/tracing/utils.py).

No OpenTelemetry import here: the names are plain strings, so the front end can
pick the trace headers out of a request whether or not the SDK is installed.
"""

from __future__ import annotations

from collections.abc import Mapping

from vllm.logger import init_logger

logger = init_logger(__name__)

# The W3C Trace Context headers a caller sends to make our span its child.
TRACE_HEADERS = ["traceparent", "tracestate"]


class SpanAttributes:
    """Attribute names of the per-request span, as upstream (OpenTelemetry's
    gen_ai semantic conventions where they exist, vLLM's own otherwise)."""

    GEN_AI_USAGE_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
    GEN_AI_USAGE_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
    GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
    GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
    GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
    GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
    GEN_AI_REQUEST_ID = "gen_ai.request.id"
    GEN_AI_REQUEST_N = "gen_ai.request.n"
    GEN_AI_USAGE_NUM_SEQUENCES = "gen_ai.usage.num_sequences"
    GEN_AI_LATENCY_TIME_IN_QUEUE = "gen_ai.latency.time_in_queue"
    GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN = "gen_ai.latency.time_to_first_token"
    GEN_AI_LATENCY_E2E = "gen_ai.latency.e2e"
    GEN_AI_LATENCY_TIME_IN_SCHEDULER = "gen_ai.latency.time_in_scheduler"
    GEN_AI_LATENCY_TIME_IN_MODEL_FORWARD = "gen_ai.latency.time_in_model_forward"
    GEN_AI_LATENCY_TIME_IN_MODEL_EXECUTE = "gen_ai.latency.time_in_model_execute"
    GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL = "gen_ai.latency.time_in_model_prefill"
    GEN_AI_LATENCY_TIME_IN_MODEL_DECODE = "gen_ai.latency.time_in_model_decode"
    GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE = "gen_ai.latency.time_in_model_inference"


def contains_trace_headers(headers: Mapping[str, str]) -> bool:
    """Whether `headers` (case-insensitive mapping, e.g. Starlette's) carry a trace context."""
    return any(h in headers for h in TRACE_HEADERS)


def extract_trace_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Only the trace-context headers of a request (they travel with it to the span)."""
    return {h: headers[h] for h in TRACE_HEADERS if h in headers}


_warned_disabled = False


def log_tracing_disabled_warning() -> None:
    """Once per process: a request carried a trace context but tracing is off."""
    global _warned_disabled
    if not _warned_disabled:
        _warned_disabled = True
        logger.warning("Received a request with trace context but tracing is disabled")
