"""Schema-driven fuzzing of `vllm serve` (upstream:
tests/entrypoints/openai/test_openai_schema.py): schemathesis reads the running
server's /openapi.json, generates valid requests for every operation, and
fails on any 5xx or on a response the schema does not describe (status,
content type, body). So the schema itself (ErrorResponse bodies, 400 for
validation errors, the SSE content of `stream: true`) is under test too.

Examples are shaped, never filtered for their outcome: generation lengths are
capped (a tiny model on a 2-core CPU), most generation bodies get a prompt
(else nearly all completions are the same 400), half of them stream. Hypothesis
runs derandomized: the same examples every run, so a failure reproduces.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.config import (
    ChecksConfig,
    CoveragePhaseConfig,
    GenerationConfig,
    PhasesConfig,
    PositiveDataAcceptanceConfig,
    ProjectConfig,
    ProjectsConfig,
    SchemathesisConfig,
)

from tests.entrypoints.openai.conftest import RemoteOpenAIServer, default_server_args

DEFAULT_TIMEOUT_SECONDS = 10
LONG_TIMEOUT_SECONDS = 60
GENERATION_ROUTES = ("/v1/completions", "/v1/chat/completions", "/invocations")
# Longest generation an example may ask for (values the server must reject,
# such as 0 or negatives, are left as generated).
MAX_TOKENS = 8
# Small, so that a generated `n` above it exercises the "never admissible"
# 400 (a request needing more sequences than the queue holds).
MAX_QUEUED = 8
MAX_EXAMPLES = 50


# The operator routes (VLLM_SERVER_DEV_MODE=1) are fuzzed too; after each
# /sleep example the engine is woken up, so the next example finds it awake.
DEV_ROUTES = ("/sleep", "/wake_up", "/is_sleeping", "/reset_prefix_cache", "/collective_rpc")
_SERVER_URL: dict[str, str] = {}


@pytest.fixture(scope="module")
def server(tiny_model_dir, chat_template_file):
    srv = RemoteOpenAIServer(
        tiny_model_dir("llama"),
        default_server_args(chat_template_file)
        + [
            "--served-model-name",
            "tiny",
            "--max-num-queued-reqs",
            str(MAX_QUEUED),
            "--enable-sleep-mode",
        ],
        env={"VLLM_SERVER_DEV_MODE": "1"},
    )
    _SERVER_URL["root"] = srv.url_root
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def get_schema(server):
    loaded = schemathesis.openapi.from_url(
        server.url_for("openapi.json"),
        config=SchemathesisConfig(
            projects=ProjectsConfig(
                default=ProjectConfig(
                    # No NUL bytes in generated strings.
                    generation=GenerationConfig(allow_x00=False, modes=[GenerationMode.POSITIVE]),
                    checks=ChecksConfig(
                        positive_data_acceptance=PositiveDataAcceptanceConfig(enabled=False)
                    ),
                    phases=PhasesConfig(coverage=CoveragePhaseConfig(enabled=False)),
                )
            )
        ),
    )
    loaded.hook(before_generate_case)
    return loaded


schema = schemathesis.pytest.from_fixture("get_schema")


@pytest.fixture(autouse=True)
def _pytest9_node_id(request):
    # schemathesis 4.32 renames each operation's sub-test through the item's
    # private `_nodeid`, which pytest 9 no longer has (`nodeid` is a property).
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


def _shape(case: schemathesis.Case, stream: bool) -> schemathesis.Case:
    body = case.body
    if case.operation.path not in GENERATION_ROUTES or not isinstance(body, dict):
        return case
    for key in ("max_tokens", "max_completion_tokens", "min_tokens"):
        value = body.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > MAX_TOKENS:
            body[key] = MAX_TOKENS
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        # Chat's default is "the rest of the context": hundreds of tokens.
        body["max_tokens"] = MAX_TOKENS
    if "messages" not in body and not body.get("prompt"):
        # `prompt` is optional in the schema (prompt_embeds is the alternative).
        body["prompt"] = "Hello"
    if stream:
        body["stream"] = True
    return case


def before_generate_case(context: schemathesis.HookContext, strategy: Any) -> Any:
    return st.tuples(strategy, st.booleans()).map(lambda pair: _shape(*pair))


@schema.parametrize()
@settings(
    deadline=LONG_TIMEOUT_SECONDS * 1000,
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
        HealthCheck.too_slow,
    ],
)
def test_openapi_stateless(case: schemathesis.Case):
    if case.operation.path.startswith("/v1/responses"):
        return  # stateful (none served here yet)
    timeout = (
        LONG_TIMEOUT_SECONDS
        if case.operation.path in GENERATION_ROUTES
        else DEFAULT_TIMEOUT_SECONDS
    )
    try:
        case.call_and_validate(timeout=timeout, headers={"Content-Type": "application/json"})
    finally:
        if case.operation.path == "/sleep":
            wake = httpx.post(_SERVER_URL["root"] + "/wake_up", timeout=LONG_TIMEOUT_SECONDS)
            assert wake.status_code == 200, wake.text


def test_schema_declares_the_error_envelope(server):
    """What the fuzzer relies on: every generation route declares its error
    statuses with ErrorResponse and its SSE stream; no FastAPI 422."""
    spec = httpx.get(server.url_for("openapi.json")).json()
    error = spec["components"]["schemas"]["ErrorInfo"]
    assert set(error["required"]) == {"message", "type", "code"}
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    for path in GENERATION_ROUTES:
        responses = spec["paths"][path]["post"]["responses"]
        assert "text/event-stream" in responses["200"]["content"], path
        for status in ("400", "404", "500", "503"):
            schema_ref = responses[status]["content"]["application/json"]["schema"]
            assert schema_ref == {"$ref": "#/components/schemas/ErrorResponse"}, path
        assert "422" not in responses and "401" not in responses, path
    assert set(spec["paths"]["/health"]["get"]["responses"]) == {"200", "503"}
    for path in DEV_ROUTES:
        operation = next(iter(spec["paths"][path].values()))
        for status in ("400", "500"):
            schema_ref = operation["responses"][status]["content"]["application/json"]["schema"]
            assert schema_ref == {"$ref": "#/components/schemas/ErrorResponse"}, path
    body = spec["paths"]["/invocations"]["post"]["requestBody"]["content"]
    assert len(body["application/json"]["schema"]["anyOf"]) == 2


def test_request_too_big_for_the_queue_is_a_bad_request(server):
    """Found by the fuzzer: n above --max-num-queued-reqs was a 503 (retry
    later) although no retry could ever succeed."""
    url = server.url_for("v1/completions")
    r = httpx.post(url, json={"prompt": "hi", "max_tokens": 1, "n": MAX_QUEUED + 1})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "n" and "sequences" in r.json()["error"]["message"]
    # n times the number of prompts counts.
    r = httpx.post(url, json={"prompt": ["a", "b", "c"], "max_tokens": 1, "n": 3})
    assert r.status_code == 400, r.text
    r = httpx.post(
        server.url_for("v1/chat/completions"),
        json={
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1,
            "n": MAX_QUEUED + 1,
        },
    )
    assert r.status_code == 400, r.text
    r = httpx.post(
        url, json={"prompt": ["a", "b"], "max_tokens": 1, "n": MAX_QUEUED // 2}, timeout=60
    )
    assert r.status_code == 200 and len(r.json()["choices"]) == MAX_QUEUED
