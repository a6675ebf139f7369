"""OpenTelemetry tracing through a real `vllm serve` (upstream: tests/tracing/).

An in-process OTLP collector (opentelemetry-proto's gRPC TraceService on a
local port) receives the spans of a `vllm serve --otlp-traces-endpoint`
subprocess on a tiny random model: one "llm_request" span per request, with
upstream's attribute names, the request's timings in a consistent order, and
the caller's W3C `traceparent` as its parent.
"""

from __future__ import annotations

import queue
import subprocess
import sys
import time
from concurrent import futures
from typing import Any

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from tests.entrypoints.openai.conftest import REPO_ROOT, RemoteOpenAIServer
from vllm.tracing import SpanAttributes

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"
PROMPT = "The quick brown fox jumps over the lazy dog"
MAX_TOKENS = 6
SPAN_WAIT_S = 60  # liveness bound: the exporter batches every 100 ms here


class _Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every exported span (flattened out of the OTLP envelope)."""

    def __init__(self) -> None:
        self.spans: queue.Queue[Any] = queue.Queue()

    def Export(self, request, context):  # noqa: N802 (the gRPC method's name)
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.put(span)
        return trace_service_pb2.ExportTraceServiceResponse()

    def wait_for(self, trace_id_hex: str | None, request_id_part: str) -> Any:
        """The span of one request (by its id), within SPAN_WAIT_S."""
        deadline = time.monotonic() + SPAN_WAIT_S
        while time.monotonic() < deadline:
            try:
                span = self.spans.get(timeout=0.5)
            except queue.Empty:
                continue
            attrs = _attributes(span)
            ours = request_id_part in str(attrs.get(SpanAttributes.GEN_AI_REQUEST_ID))
            if ours and (trace_id_hex is None or span.trace_id.hex() == trace_id_hex):
                return span
        raise AssertionError(f"no span for {request_id_part} within {SPAN_WAIT_S} s")


def _attributes(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


@pytest.fixture(scope="module")
def collector():
    servicer = _Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, port
    server.stop(grace=None)


@pytest.fixture(scope="module")
def server(tiny_model_dir, collector, tmp_path_factory):
    _, port = collector
    template = tmp_path_factory.mktemp("tracing") / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    args = [
        "--chat-template",
        str(template),
        "--dtype",
        "float32",
        "--max-model-len",
        "256",
        "--kv-cache-memory-bytes",
        str(16 * 2**20),
        "--served-model-name",
        "tiny",
        "--otlp-traces-endpoint",
        f"http://127.0.0.1:{port}",
    ]
    # Export each batch after 100 ms instead of the SDK's 5 s default.
    srv = RemoteOpenAIServer(tiny_model_dir("llama"), args, env={"OTEL_BSP_SCHEDULE_DELAY": "100"})
    yield srv
    srv.stop()


def _complete(server: RemoteOpenAIServer, request_id: str, headers: dict[str, str]) -> dict:
    body = {
        "model": "tiny",
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "temperature": 0.5,
        "top_p": 0.9,
        "ignore_eos": True,
    }
    r = httpx.post(
        server.url_for("v1", "completions"),
        json=body,
        headers={"X-Request-Id": request_id, **headers},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_span_carries_the_request_timings_and_the_callers_trace(server, collector):
    servicer, _ = collector
    traceparent = f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"
    body = _complete(server, "traced-1", {"traceparent": traceparent})
    span = servicer.wait_for(TRACE_ID, "traced-1")

    assert span.name == "llm_request"
    assert span.kind == span.SPAN_KIND_SERVER
    assert span.parent_span_id.hex() == PARENT_SPAN_ID  # the caller's span
    a = _attributes(span)
    assert a[SpanAttributes.GEN_AI_USAGE_PROMPT_TOKENS] == body["usage"]["prompt_tokens"]
    assert a[SpanAttributes.GEN_AI_USAGE_COMPLETION_TOKENS] == MAX_TOKENS
    assert a[SpanAttributes.GEN_AI_REQUEST_MAX_TOKENS] == MAX_TOKENS
    assert a[SpanAttributes.GEN_AI_REQUEST_TEMPERATURE] == pytest.approx(0.5)
    assert a[SpanAttributes.GEN_AI_REQUEST_TOP_P] == pytest.approx(0.9)
    assert a[SpanAttributes.GEN_AI_REQUEST_N] == 1
    queue_t = a[SpanAttributes.GEN_AI_LATENCY_TIME_IN_QUEUE]
    prefill = a[SpanAttributes.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL]
    decode = a[SpanAttributes.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE]
    inference = a[SpanAttributes.GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE]
    ttft = a[SpanAttributes.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN]
    e2e = a[SpanAttributes.GEN_AI_LATENCY_E2E]
    assert queue_t > 0 and prefill > 0 and decode > 0 and ttft > 0
    # The core's queue + prefill happen inside the front end's time to first
    # token, which is inside the whole request; prefill + decode = inference.
    assert queue_t + prefill <= ttft < e2e
    assert inference == pytest.approx(prefill + decode, abs=1e-6)
    assert decode < e2e
    duration_s = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9
    assert duration_s == pytest.approx(e2e, abs=0.25)  # ends as the request finishes
    assert abs(span.start_time_unix_nano / 1e9 - time.time()) < 120


def test_request_without_traceparent_starts_its_own_trace(server, collector):
    servicer, _ = collector
    _complete(server, "untraced-2", {})
    span = servicer.wait_for(None, "untraced-2")
    assert span.parent_span_id == b""  # a root span
    assert span.trace_id.hex() != TRACE_ID
    assert len(span.trace_id) == 16 and any(span.trace_id)


def test_chat_request_is_traced_too(server, collector):
    servicer, _ = collector
    traceparent = f"00-{'ab' * 16}-{'cd' * 8}-01"
    r = httpx.post(
        server.url_for("v1", "chat", "completions"),
        json={
            "model": "tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
        },
        headers={"X-Request-Id": "chat-3", "traceparent": traceparent},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    span = servicer.wait_for("ab" * 16, "chat-3")
    assert span.parent_span_id.hex() == "cd" * 8


# Imports opentelemetry.sdk as if it were not installed, then builds the config.
_WITHOUT_SDK = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry.sdk" or name.startswith("opentelemetry.sdk."):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, _Block())
from vllm.config import ObservabilityConfig
ObservabilityConfig(otlp_traces_endpoint="http://127.0.0.1:4317")
"""


def test_endpoint_is_refused_without_the_sdk():
    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT_SDK],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert proc.returncode != 0
    assert "--otlp-traces-endpoint" in proc.stderr
    assert "OpenTelemetry is not available" in proc.stderr


def test_detailed_traces_empty_endpoint_and_offline_engine_are_refused():
    from vllm.config import ObservabilityConfig, VllmConfig
    from vllm.v1.engine.llm_engine import LLMEngine

    with pytest.raises(ValueError, match="--collect-detailed-traces"):
        ObservabilityConfig(collect_detailed_traces=["model"])
    with pytest.raises(ValueError, match="--otlp-traces-endpoint"):
        ObservabilityConfig(otlp_traces_endpoint=" ")
    # LLM / LLMEngine track no per-request timings: refused before anything starts.
    config = VllmConfig(
        observability_config=ObservabilityConfig(otlp_traces_endpoint="http://127.0.0.1:4317")
    )
    with pytest.raises(ValueError, match="--otlp-traces-endpoint"):
        LLMEngine(config, executor_class=None, log_stats=False)  # type: ignore[arg-type]
