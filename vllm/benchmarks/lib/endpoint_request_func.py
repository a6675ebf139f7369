"""One streamed request to an OpenAI-compatible endpoint, timed (upstream:
vllm/benchmarks/lib/endpoint_request_func.py).

TTFT is the time to the first chunk that carries text; every later chunk adds
an inter-token latency. The token count comes from the final usage chunk
(`stream_options.include_usage`), so a chunk holding several tokens is
counted right.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestFuncInput:
    prompt: str | list[int]
    api_url: str
    prompt_len: int
    output_len: int
    model: str
    extra_body: dict[str, Any] = field(default_factory=dict)


@dataclass
class RequestFuncOutput:
    generated_text: str = ""
    success: bool = False
    latency: float = 0.0
    output_tokens: int = 0
    ttft: float = 0.0
    # Seconds between consecutive text chunks.
    itl: list[float] = field(default_factory=list)
    # perf_counter() of every text chunk (for peak throughput).
    token_timestamps: list[float] = field(default_factory=list)
    prompt_len: int = 0
    start_time: float = 0.0
    error: str = ""


async def _sse_events(response: Any) -> AsyncIterator[dict[str, Any]]:
    """The JSON payloads of a `data: ...` event stream, until [DONE]."""
    async for raw in response.content:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


async def _stream(
    payload: dict[str, Any], request_input: RequestFuncInput, session: Any, text_of: Any
) -> RequestFuncOutput:
    output = RequestFuncOutput(prompt_len=request_input.prompt_len)
    start = most_recent = time.perf_counter()
    output.start_time = start
    try:
        async with session.post(request_input.api_url, json=payload) as response:
            if response.status != 200:
                output.error = f"HTTP {response.status}: {await response.text()}"
                return output
            async for event in _sse_events(response):
                if event.get("error"):
                    output.error = json.dumps(event["error"])
                    return output
                text = text_of(event)
                if text:
                    now = time.perf_counter()
                    if not output.token_timestamps:
                        output.ttft = now - start
                    else:
                        output.itl.append(now - most_recent)
                    most_recent = now
                    output.token_timestamps.append(now)
                    output.generated_text += text
                usage = event.get("usage")
                if usage:
                    output.output_tokens = usage.get("completion_tokens") or 0
        output.latency = time.perf_counter() - start
        output.success = bool(output.token_timestamps)
        if not output.success:
            output.error = "The stream carried no text."
    except Exception as e:  # noqa: BLE001 - a failed request is a data point
        output.error = f"{type(e).__name__}: {e}"
    return output


async def request_openai_completions(
    request_input: RequestFuncInput, session: Any
) -> RequestFuncOutput:
    payload = {
        "model": request_input.model,
        "prompt": request_input.prompt,
        "max_tokens": request_input.output_len,
        "stream": True,
        "stream_options": {"include_usage": True},
        **request_input.extra_body,
    }

    def text_of(event: dict[str, Any]) -> str:
        choices = event.get("choices") or []
        return choices[0].get("text") or "" if choices else ""

    return await _stream(payload, request_input, session, text_of)


async def request_openai_chat(request_input: RequestFuncInput, session: Any) -> RequestFuncOutput:
    payload = {
        "model": request_input.model,
        "messages": [{"role": "user", "content": request_input.prompt}],
        "max_completion_tokens": request_input.output_len,
        "stream": True,
        "stream_options": {"include_usage": True},
        **request_input.extra_body,
    }

    def text_of(event: dict[str, Any]) -> str:
        choices = event.get("choices") or []
        return (choices[0].get("delta") or {}).get("content") or "" if choices else ""

    return await _stream(payload, request_input, session, text_of)


def fetch_model_info(base_url: str, api_key: str | None = None) -> tuple[str, str]:
    """(id, root) of the server's first model, from /v1/models."""
    request = urllib.request.Request(base_url + "/v1/models")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(request, timeout=30) as response:
        card = json.load(response)["data"][0]
    return card["id"], card.get("root") or card["id"]
