"""OpenTelemetry tracing of requests (upstream: vllm/tracing/).

`--otlp-traces-endpoint URL` makes the front end (`AsyncLLM`) call
`init_tracer` and export one span per finished request, named "llm_request",
with the `SpanAttributes` latencies and token counts; a request's W3C
`traceparent` / `tracestate` headers (taken by the OpenAI server, carried in
`EngineCoreRequest.trace_headers`) make that span a child of the caller's.
Upstream's function-level `instrument` decorators and per-worker tracers
(`--collect-detailed-traces`) are not built here.
"""

from __future__ import annotations

from typing import Any

from vllm.tracing.otel import (
    SpanKind,
    extract_trace_context,
    init_otel_tracer,
    is_otel_available,
    manual_instrument_otel,
    otel_import_error_traceback,
)
from vllm.tracing.utils import (
    SpanAttributes,
    contains_trace_headers,
    extract_trace_headers,
    log_tracing_disabled_warning,
)

__all__ = [
    "init_tracer",
    "instrument_manual",
    "is_tracing_available",
    "SpanAttributes",
    "SpanKind",
    "extract_trace_context",
    "extract_trace_headers",
    "contains_trace_headers",
    "log_tracing_disabled_warning",
    "otel_import_error_traceback",
]


def init_tracer(
    instrumenting_module_name: str,
    otlp_traces_endpoint: str,
    extra_attributes: dict[str, str] | None = None,
) -> Any:
    """The tracer exporting to the endpoint (raises when the SDK is missing)."""
    return init_otel_tracer(instrumenting_module_name, otlp_traces_endpoint, extra_attributes)


def instrument_manual(
    span_name: str,
    start_time: int,
    end_time: int | None = None,
    attributes: dict[str, Any] | None = None,
    context: Any = None,
    kind: Any = None,
) -> None:
    """One span with explicit start / end times in nanoseconds since the epoch;
    `context` from `extract_trace_context` makes it a child of the caller's span."""
    manual_instrument_otel(span_name, start_time, end_time, attributes, context, kind)


def is_tracing_available() -> bool:
    return is_otel_available()
