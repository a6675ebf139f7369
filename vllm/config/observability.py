"""Observability configuration: tracing (upstream: vllm/config/observability.py).

Only the tracing fields are here; `--disable-log-stats` stays on `EngineArgs`
(it decides `log_stats` of the engines, as upstream).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DetailedTraceModules = Literal["model", "worker", "all"]


@dataclass
class ObservabilityConfig:
    """Where request traces go (None: tracing off)."""

    # OTLP collector URL; one span per finished request is exported there
    # (gRPC by default, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf for HTTP).
    otlp_traces_endpoint: str | None = None
    # Upstream's per-step model forward / execute timings in the span: not
    # built here, so any value is refused.
    collect_detailed_traces: list[DetailedTraceModules] | None = None

    def __post_init__(self) -> None:
        if self.collect_detailed_traces:
            raise ValueError(
                f"collect_detailed_traces={self.collect_detailed_traces} "
                "(--collect-detailed-traces) is not built in this implementation: the "
                "request spans carry queue, prefill, decode and end-to-end times only."
            )
        if self.otlp_traces_endpoint is not None:
            from vllm.tracing import is_tracing_available, otel_import_error_traceback

            if not self.otlp_traces_endpoint.strip():
                raise ValueError("otlp_traces_endpoint (--otlp-traces-endpoint) is empty.")
            if not is_tracing_available():
                raise ValueError(
                    "OpenTelemetry is not available, so otlp_traces_endpoint "
                    "(--otlp-traces-endpoint) cannot be used: install vllm[otel] "
                    "(opentelemetry-sdk and the OTLP exporters). Original error:\n"
                    f"{otel_import_error_traceback}"
                )

    @property
    def tracing_enabled(self) -> bool:
        return self.otlp_traces_endpoint is not None
