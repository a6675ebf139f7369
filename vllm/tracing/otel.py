"""The OpenTelemetry backend (upstream: vllm/tracing/otel.py).

The SDK and the OTLP exporters are an optional extra (`pip install vllm[otel]`);
without them `is_otel_available()` is False and `--otlp-traces-endpoint` is
refused by `ObservabilityConfig` with the import error. The exporter's protocol
is OpenTelemetry's own variable `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`: "grpc"
(the default, as upstream) or "http/protobuf".
"""

from __future__ import annotations

import atexit
import os
import traceback
from collections.abc import Mapping
from typing import Any

from vllm.logger import init_logger

logger = init_logger(__name__)

try:
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace import SpanKind, set_tracer_provider
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _IS_OTEL_AVAILABLE = True
    otel_import_error_traceback: str | None = None
except ImportError:
    _IS_OTEL_AVAILABLE = False
    otel_import_error_traceback = traceback.format_exc()
    SpanKind = None  # type: ignore[assignment,misc]

PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
PROTOCOLS = ("grpc", "http/protobuf")


def is_otel_available() -> bool:
    return _IS_OTEL_AVAILABLE


def get_span_exporter(endpoint: str) -> Any:
    """The OTLP exporter of the configured protocol (imported here: each
    protocol's package is only needed when it is chosen)."""
    protocol = os.environ.get(PROTOCOL_ENV, "grpc")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=endpoint, insecure=True)
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        return HttpExporter(endpoint=endpoint)
    raise ValueError(
        f"Unsupported OTLP protocol {protocol!r} in {PROTOCOL_ENV}; choose one of {PROTOCOLS}."
    )


def init_otel_tracer(
    instrumenting_module_name: str,
    otlp_traces_endpoint: str,
    extra_attributes: dict[str, str] | None = None,
) -> Any:
    """Install a global tracer provider that batches spans to the endpoint."""
    if not _IS_OTEL_AVAILABLE:
        raise ValueError(
            "OpenTelemetry is not available: cannot export traces to "
            f"--otlp-traces-endpoint. Install vllm[otel]. Original error:\n"
            f"{otel_import_error_traceback}"
        )
    attrs = {
        "vllm.instrumenting_module_name": instrumenting_module_name,
        "vllm.process_id": str(os.getpid()),
        **(extra_attributes or {}),
    }
    provider = TracerProvider(resource=Resource.create(attrs))
    provider.add_span_processor(BatchSpanProcessor(get_span_exporter(otlp_traces_endpoint)))
    set_tracer_provider(provider)
    # Flush the batch at exit: the last requests' spans would be lost otherwise.
    atexit.register(provider.shutdown)
    return provider.get_tracer(instrumenting_module_name)


def extract_trace_context(headers: Mapping[str, str] | None) -> Any:
    """The caller's span context from W3C headers (None: a root span)."""
    if _IS_OTEL_AVAILABLE and headers:
        return TraceContextTextMapPropagator().extract(headers)
    return None


def manual_instrument_otel(
    span_name: str,
    start_time: int,
    end_time: int | None = None,
    attributes: dict[str, Any] | None = None,
    context: Any = None,
    kind: Any = None,
) -> None:
    """Start and end one span at explicit times (nanoseconds since the epoch)."""
    if not _IS_OTEL_AVAILABLE:
        return
    tracer = trace.get_tracer(__name__)
    kwargs: dict[str, Any] = {"name": span_name, "context": context, "start_time": start_time}
    if kind is not None:
        kwargs["kind"] = kind
    span = tracer.start_span(**kwargs)
    if attributes:
        span.set_attributes(attributes)
    span.end(end_time=end_time)
