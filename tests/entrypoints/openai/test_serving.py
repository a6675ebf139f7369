"""`vllm serve` end to end with the official `openai` client (one server for
the module): completions and chat, streamed and not, n, logprobs, usage,
echo, tokenization, metrics, client disconnects, seeds, and SIGTERM last."""

from __future__ import annotations

import asyncio
import json
import math
import time

import httpx
import pytest

from tests.entrypoints.openai.conftest import MAX_MODEL_LEN, RemoteOpenAIServer, default_server_args

PROMPT = "The quick brown fox jumps over"
MESSAGES = [{"role": "user", "content": "Say hello to the lazy dog."}]
EXPECTED_METRICS = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
]


@pytest.fixture(scope="module")
def server(tiny_model_dir, chat_template_file):
    srv = RemoteOpenAIServer(
        tiny_model_dir("llama"),
        default_server_args(chat_template_file) + ["--served-model-name", "tiny"],
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.get_client()


GREEDY = dict(temperature=0.0, extra_body={"ignore_eos": True})
# Byte-level test tokenizer: distinct tokens may decode to the same text.
GREEDY_IDS = dict(
    temperature=0.0, extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True}
)


def test_models_and_meta(server, client):
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny"] and models[0].max_model_len == MAX_MODEL_LEN
    assert httpx.get(server.url_for("version")).json()["version"]
    assert httpx.get(server.url_for("ping")).status_code == 200
    assert httpx.get(server.url_for("health")).status_code == 200


def test_completion_and_usage(client):
    out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=5, **GREEDY)
    assert out.id.startswith("cmpl-") and out.object == "text_completion"
    choice = out.choices[0]
    assert choice.finish_reason == "length" and choice.text
    usage = out.usage
    assert usage.completion_tokens == 5
    assert usage.prompt_tokens > 0 and usage.total_tokens == usage.prompt_tokens + 5
    # The model field may be omitted: the served model answers.
    assert (
        client.completions.create(
            model="tiny", prompt=[PROMPT, PROMPT], max_tokens=3, **GREEDY
        ).usage.completion_tokens
        == 6
    )


def test_completion_stream_equals_non_stream(client):
    full = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, **GREEDY)
    chunks = list(
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, stream=True, **GREEDY)
    )
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
    assert reasons == ["length"] and chunks[-1].choices[0].finish_reason == "length"


def test_chat_stream_equals_non_stream_and_usage(client):
    full = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10, **GREEDY)
    assert full.object == "chat.completion" and full.choices[0].message.role == "assistant"
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=10,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ] == ["length"]
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 10
    assert last.usage.total_tokens == last.usage.prompt_tokens + 10
    assert last.usage.prompt_tokens == full.usage.prompt_tokens
    no_usage = list(
        client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": False},
            **GREEDY,
        )
    )
    assert all(c.usage is None for c in no_usage)


def test_chat_stream_deltas_carry_only_what_is_present(server):
    """Raw SSE: the first delta has the role, later ones do not, and no delta
    carries an empty `tool_calls` (a JS client's `if (delta.tool_calls)` would
    take [] for a tool call)."""
    body = {
        "model": "tiny",
        "messages": MESSAGES,
        "max_tokens": 4,
        "stream": True,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    with httpx.stream("POST", server.url_for("v1/chat/completions"), json=body, timeout=60) as r:
        events = [
            json.loads(line[6:])
            for line in r.iter_lines()
            if line.startswith("data: ") and line != "data: [DONE]"
        ]
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert deltas[0]["role"] == "assistant"
    assert all("role" not in d for d in deltas[1:]), deltas
    assert all("tool_calls" not in d for d in deltas), deltas


def test_continuous_usage_stats(client):
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=10,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            extra_body={"min_tokens": 10, "ignore_eos": True},
        )
    )
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 10


def test_n(client):
    seen: dict[int, str] = {0: "", 1: ""}
    for chunk in client.chat.completions.create(
        model="tiny", messages=MESSAGES, n=2, max_tokens=6, stream=True, seed=7, temperature=1.0
    ):
        for c in chunk.choices:
            seen[c.index] += c.delta.content or ""
    assert seen[0] and seen[1]
    out = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        n=3,
        max_tokens=8,
        temperature=0.7,
        seed=1,
        extra_body={"return_token_ids": True},
    )
    assert sorted(c.index for c in out.choices) == [0, 1, 2]
    assert len({c.text for c in out.choices}) > 1
    assert out.usage.completion_tokens == sum(len(c.token_ids) for c in out.choices)


def test_completion_logprobs(client):
    out = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=6, logprobs=3, **GREEDY_IDS
    )
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    for token_lp, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert math.isfinite(token_lp) and token_lp <= 0
        assert 3 <= len(top) <= 4
        # Greedy: the chosen token is the most likely one.
        assert token_lp == pytest.approx(max(top.values()), abs=1e-5)
    assert lp.text_offset == sorted(lp.text_offset)


def test_chat_logprobs(client):
    out = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=5, logprobs=True, top_logprobs=3, **GREEDY_IDS
    )
    content = out.choices[0].logprobs.content
    assert len(content) == 5
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert all(-9999.0 <= t.logprob <= 0 for t in entry.top_logprobs)
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-5)


def test_echo(client):
    out = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=3, echo=True, logprobs=1, **GREEDY_IDS
    )
    choice = out.choices[0]
    assert choice.text.startswith(PROMPT)
    lp = choice.logprobs
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(1 <= len(t) <= 2 for t in lp.top_logprobs[1:])
    only = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=0, echo=True)
    assert only.choices[0].text == PROMPT and only.usage.completion_tokens == 0


def test_stop_strings(client):
    full = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, **GREEDY)
    text = full.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), text
    for stream in (False, True):
        kwargs = dict(model="tiny", prompt=PROMPT, max_tokens=16, stop=[stop], **GREEDY)
        if stream:
            chunks = list(client.completions.create(stream=True, **kwargs))
            got = "".join(c.choices[0].text for c in chunks)
            last = chunks[-1].choices[0]
        else:
            last = client.completions.create(**kwargs).choices[0]
            got = last.text
        assert got == text[: text.index(stop)], (stream, stop, text)
        assert last.finish_reason == "stop" and last.stop_reason == stop


def test_tokenize_detokenize(server):
    tok = httpx.post(server.url_for("tokenize"), json={"prompt": PROMPT}).json()
    assert tok["count"] == len(tok["tokens"]) > 0 and tok["max_model_len"] == MAX_MODEL_LEN
    detok = httpx.post(server.url_for("detokenize"), json={"tokens": tok["tokens"]}).json()
    assert detok["prompt"] == PROMPT
    chat = httpx.post(server.url_for("tokenize"), json={"messages": MESSAGES}).json()
    assert chat["count"] > tok["count"]


def test_lenient_inputs(client):
    msgs = [{"role": "user", "content": "hi", "some_extra": "ignored"}]
    a = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=4, **GREEDY)
    parts = [{"role": "tester", "content": [{"type": "text", "text": "hi"}]}]
    plain = [{"role": "tester", "content": "hi"}]
    b = client.chat.completions.create(model="tiny", messages=parts, max_tokens=4, **GREEDY)
    c = client.chat.completions.create(model="tiny", messages=plain, max_tokens=4, **GREEDY)
    assert a.choices[0].message.content is not None
    assert b.choices[0].message.content == c.choices[0].message.content


def test_invocations(server, client):
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 5, "temperature": 0}
    chat = httpx.post(server.url_for("v1/chat/completions"), json=body).json()
    inv = httpx.post(server.url_for("invocations"), json=body).json()
    assert inv.keys() == chat.keys()
    assert inv["choices"][0]["message"] == chat["choices"][0]["message"]


def test_seeded_sampling_ignores_batch_mates(server):
    async def run():
        async with server.get_async_client() as c:

            async def seeded():
                out = await c.completions.create(
                    model="tiny", prompt=PROMPT, max_tokens=8, temperature=0.8, seed=42
                )
                return out.choices[0].text

            alone = await seeded()
            others = [
                c.completions.create(
                    model="tiny", prompt="def hello(", max_tokens=8, temperature=1.0
                )
                for _ in range(4)
            ]
            results = await asyncio.gather(seeded(), *others)
            return alone, results[0]

    alone, in_batch = asyncio.run(run())
    assert alone == in_batch


def test_metrics(server, client):
    client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, **GREEDY)
    values = server.metrics()
    for name in EXPECTED_METRICS:
        assert name in values, name
    assert values["vllm:generation_tokens_total"] > 0
    assert values["vllm:request_success_total"] > 0


BAD_REQUESTS = [
    # (path, body, status, substring of error.message)
    ("v1/completions", {"model": "nope", "prompt": "hi"}, 404, "The model `nope` does not exist."),
    ("v1/completions", {"prompt": [999999]}, 400, "out of vocabulary"),
    ("v1/completions", {"prompt": [-1]}, 400, "greater than or equal to 0"),
    ("v1/completions", {"prompt": [[-1]]}, 400, "greater than or equal to 0"),
    (
        "v1/completions",
        {"prompt": None, "prompt_embeds": []},
        400,
        "Either prompt or prompt_embeds must be provided and non-empty.",
    ),
    ("v1/completions", {"prompt": ""}, 400, "non-empty"),
    (
        "v1/completions",
        {"prompt": "hi", "response_format": {"type": "json_schema"}},
        400,
        "json_schema",
    ),
    (
        "v1/completions",
        {"prompt": "hi", "stream_options": {"include_usage": True}},
        400,
        "Stream options can only be defined when `stream=True`.",
    ),
    (
        "v1/completions",
        {"prompt": "hi", "stream": True, "prompt_logprobs": 1},
        400,
        "prompt_logprobs",
    ),
    ("v1/completions", {"prompt": "hi", "logprobs": 6}, 400, "max allowed"),
    ("v1/completions", {"prompt": "hi", "seed": 2**64}, 400, "less than or equal"),
    ("v1/completions", {"prompt": "hi", "seed": -(2**64)}, 400, "greater than or equal"),
    ("v1/completions", {"prompt": "hi", "max_tokens": 5000}, 400, "maximum context length"),
    ("v1/completions", {"prompt": "hi " * 2000}, 400, "maximum context length"),
    ("v1/completions", {"prompt": "hi", "min_tokens": 20, "max_tokens": 10}, 400, "min_tokens"),
    ("v1/completions", {"prompt": "hi", "min_tokens": 5000, "max_tokens": None}, 400, "min_tokens"),
    ("v1/chat/completions", {"messages": MESSAGES, "min_tokens": 5000}, 400, "min_tokens"),
    ("v1/completions", {"prompt": "hi", "n": 10**9}, 400, "n"),
    ("v1/completions", {"prompt": ["a"] * 5000}, 400, "validation error"),
    ("v1/completions", {"prompt": "hi", "temperature": -1}, 400, "temperature"),
    (
        "v1/chat/completions",
        {"messages": MESSAGES, "logprobs": True, "top_logprobs": 6},
        400,
        "top_logprobs",
    ),
    (
        "v1/chat/completions",
        {"messages": MESSAGES, "logprobs": True, "top_logprobs": 6, "stream": True},
        400,
        "top_logprobs",
    ),
    (
        "v1/chat/completions",
        {"messages": MESSAGES, "top_logprobs": 2},
        400,
        "`logprobs` must be set to true",
    ),
    (
        "v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi " * 2000}]},
        400,
        "maximum context length",
    ),
    (
        "v1/chat/completions",
        {"messages": MESSAGES, "add_generation_prompt": True, "continue_final_message": True},
        400,
        "Cannot set both",
    ),
    (
        "v1/chat/completions",
        {"messages": MESSAGES, "chat_template_kwargs": {"tokenize": True}},
        400,
        "tokenize",
    ),
    (
        "v1/chat/completions",
        {"messages": MESSAGES, "chat_template": "{{ 1 }}"},
        400,
        "--trust-request-chat-template",
    ),
    (
        "v1/chat/completions",
        {
            "messages": MESSAGES,
            "tool_choice": "auto",
            "tools": [{"type": "function", "function": {"name": "f"}}],
        },
        400,
        '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser',
    ),
    ("v1/chat/completions", {"messages": []}, 400, "validation error"),
    ("v1/chat/completions", {"model": "nope", "messages": MESSAGES}, 404, "does not exist"),
    # A lone surrogate (valid JSON, not encodable UTF-8) quoted in the error
    # body made rendering it fail: a 500.
    ("v1/completions", {"model": "\ud800", "prompt": "hi"}, 404, "The model `"),
    ("v1/completions", {"prompt": "hi", "logit_bias": {"1": float("nan")}}, 400, "NaN"),
    ("v1/no/such/route", {"prompt": "hi"}, 404, "Not Found"),
    ("tokenize", {"prompt": 5}, 400, "validation error"),
    ("detokenize", {"tokens": [10**9]}, 400, "out of vocabulary"),
]


@pytest.mark.parametrize(
    "path,body,status,message", BAD_REQUESTS, ids=[f"{p}:{m[:30]}" for p, _, _, m in BAD_REQUESTS]
)
def test_bad_request(server, path, body, status, message):
    # json.dumps escapes to ASCII: a lone surrogate travels as "\ud800".
    content = json.dumps({"model": "tiny", **body} if "model" not in body else body)
    r = httpx.post(
        server.url_for(path),
        content=content,
        timeout=30,
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == status and message in error["message"]
    assert set(error) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("content", ['"a string"', "[1, 2]", "42", "null", "{not json"])
def test_malformed_bodies(server, content):
    r = httpx.post(
        server.url_for("v1/chat/completions"),
        content=content,
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == 400


def test_wrong_content_type_and_bounded_errors(server):
    r = httpx.post(server.url_for("v1/completions"), data={"prompt": "hi"})
    assert r.status_code == 400 and "application/json" in r.json()["error"]["message"]
    # A body full of wrong values gets a bounded answer.
    body = {"prompt": [{"x": "y" * 40}] * 100, "model": "tiny"}
    r = httpx.post(server.url_for("v1/completions"), json=body)
    assert r.status_code == 400 and len(r.content) < 20_000


def test_server_survives_bad_requests(client):
    out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, **GREEDY)
    assert out.usage.completion_tokens == 4


def test_openapi_schema_and_type_confusion(server):
    """The schema documents the error body; a value of the wrong type in any
    documented field of a request is a 4xx, never a 5xx (a small fuzzer)."""
    spec = httpx.get(server.url_for("openapi.json")).json()
    assert "ErrorResponse" in spec["components"]["schemas"]
    bodies = {
        "/v1/completions": {"model": "tiny", "prompt": "hi", "max_tokens": 1},
        "/v1/chat/completions": {"model": "tiny", "messages": MESSAGES, "max_tokens": 1},
    }
    schemas = spec["components"]["schemas"]
    cases = []
    for path, base in bodies.items():
        assert "400" in spec["paths"][path]["post"]["responses"]
        ref = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"][
            "$ref"
        ].rsplit("/", 1)[-1]
        cases += [
            (path, {**base, field: value})
            for field in schemas[ref]["properties"]
            for value in ("x", -1, 2**70, {})
        ]

    async def run() -> list[tuple[int, str, str]]:
        limit = asyncio.Semaphore(16)
        async with httpx.AsyncClient(base_url=server.url_root, timeout=60) as http:

            async def one(path: str, body: dict) -> tuple[int, str, str]:
                async with limit:
                    r = await http.post(path, json=body)
                    return r.status_code, json.dumps(body)[:200], r.text[:300]

            return await asyncio.gather(*[one(p, b) for p, b in cases])

    failures = [r for r in asyncio.run(run()) if r[0] >= 500]
    assert not failures, failures


def _wait_idle(server: RemoteOpenAIServer, timeout: float = 15.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        values = server.metrics()
        if (
            values["vllm:num_requests_running"] == 0
            and values["vllm:num_requests_waiting"] == 0
            and values["vllm:kv_cache_usage_perc"] == 0
        ):
            return values
        assert time.monotonic() < deadline, values
        time.sleep(0.2)


def test_disconnects_free_kv_blocks(server):
    """50 streams whose clients leave early, and non-streaming requests whose
    clients time out: all are aborted, every KV block is freed. (Run to the
    end, 55 requests of 480 tokens would keep the engine busy far longer.)"""
    body = {
        "model": "tiny",
        "prompt": PROMPT,
        "max_tokens": 480,
        "min_tokens": 480,
        "stream": True,
        "ignore_eos": True,
    }

    async def one_stream(client: httpx.AsyncClient) -> int:
        async with client.stream("POST", server.url_for("v1/completions"), json=body) as r:
            assert r.status_code == 200
            lines = 0
            async for line in r.aiter_lines():
                lines += bool(line.startswith("data:"))
                if lines == 2:
                    break  # leave: the connection closes
            return lines

    async def one_timeout(client: httpx.AsyncClient) -> None:
        with pytest.raises(httpx.ReadTimeout):
            await client.post(
                server.url_for("v1/completions"), json={**body, "stream": False}, timeout=0.5
            )

    async def run():
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(timeout=30, limits=limits) as client:
            results = await asyncio.gather(
                *[one_stream(client) for _ in range(50)], *[one_timeout(client) for _ in range(5)]
            )
        assert results[:50] == [2] * 50

    before = server.metrics()
    asyncio.run(run())
    after = _wait_idle(server, timeout=5.0)
    # Aborted, not run to the end: no new successes, far fewer than 55 x 100 tokens.
    assert after["vllm:request_success_total"] == before["vllm:request_success_total"]
    assert (
        after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    ) < 55 * 480 / 4
    start = time.monotonic()
    out = server.get_client().completions.create(model="tiny", prompt=PROMPT, max_tokens=5)
    assert out.usage.completion_tokens == 5 and time.monotonic() - start < 5


@pytest.mark.parametrize("backend", ["vllm", "openai-chat"])
def test_bench_serve(server, backend):
    """`vllm bench serve` against this server prints upstream's summary."""
    import subprocess
    import sys

    from tests.entrypoints.openai.conftest import REPO_ROOT

    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "bench",
        "serve",
        "--backend",
        backend,
        "--port",
        str(server.port),
        "--num-prompts",
        "12",
        "--random-input-len",
        "24",
        "--random-output-len",
        "6",
        "--request-rate",
        "50",
        "--max-concurrency",
        "4",
        "--ignore-eos",
        "--disable-tqdm",
    ]
    out = subprocess.run(
        cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    lines = {
        line.split(":", 1)[0].strip(): line.rsplit(None, 1)[-1]
        for line in out.splitlines()
        if ":" in line
    }
    assert lines["Successful requests"] == "12" and lines["Failed requests"] == "0"
    assert lines["Total generated tokens"] == str(12 * 6)
    for metric in ("TTFT", "TPOT", "ITL", "E2EL"):
        for stat in ("Mean", "Median", "P99"):
            assert float(lines[f"{stat} {metric} (ms)"]) > 0
    for key in (
        "Request throughput (req/s)",
        "Output token throughput (tok/s)",
        "Total Token throughput (tok/s)",
    ):
        assert float(lines[key]) > 0


def test_sigterm_stops_server_and_children(server):
    """SIGTERM with requests in flight (runs last: it stops the module's server)."""
    children = server.children()
    assert children, "the engine core runs in a child process"
    # Long enough (~1 s or more) to be in flight when the signal lands.
    body = {
        "model": "tiny",
        "prompt": PROMPT,
        "max_tokens": 480,
        "min_tokens": 480,
        "ignore_eos": True,
        "stream": True,
    }
    frames: list[str] = []

    async def run():
        async with httpx.AsyncClient(timeout=30) as client:

            async def stream() -> None:
                try:
                    async with client.stream(
                        "POST", server.url_for("v1/completions"), json=body
                    ) as r:
                        async for line in r.aiter_lines():
                            frames.append(line)
                except httpx.HTTPError:
                    frames.append("<connection error>")

            task = asyncio.create_task(stream())
            while len(frames) < 3:
                await asyncio.sleep(0.05)
            start = time.monotonic()
            server.proc.send_signal(15)
            await asyncio.wait_for(task, timeout=10)
            return start

    start = asyncio.run(run())
    server.proc.wait(timeout=10)
    assert time.monotonic() - start < 10
    assert server.proc.returncode == 0
    # The in-flight stream did not end with a normal finish.
    finished = [json.loads(f[6:]) for f in frames if f.startswith("data: {")]
    assert not any(c["choices"] and c["choices"][0]["finish_reason"] == "length" for c in finished)
    for child in children:
        child.wait(timeout=10)
