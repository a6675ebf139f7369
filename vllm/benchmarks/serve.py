"""Online serving benchmark: `vllm bench serve` (upstream: vllm/benchmarks/serve.py).

Sends a random dataset to a running OpenAI-compatible server (ours or any
other), streaming every response, at `--request-rate` requests per second
(Poisson arrivals, or gamma with `--burstiness`), at most `--max-concurrency`
at a time, and prints upstream's summary: request and token throughput, and
mean / median / P99 of TTFT, TPOT (excluding the first token), ITL and E2EL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from vllm.benchmarks.lib.endpoint_request_func import (
    RequestFuncInput,
    RequestFuncOutput,
    fetch_model_info,
    request_openai_chat,
    request_openai_completions,
)
from vllm.benchmarks.throughput import SampleRequest, sample_random_requests

if TYPE_CHECKING:
    from vllm.tokenizers import TokenizerLike

BACKENDS = {
    "vllm": request_openai_completions,
    "openai": request_openai_completions,
    "openai-chat": request_openai_chat,
}
DEFAULT_ENDPOINTS = {
    "vllm": "/v1/completions",
    "openai": "/v1/completions",
    "openai-chat": "/v1/chat/completions",
}


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", type=str, default="vllm", choices=list(BACKENDS))
    parser.add_argument(
        "--base-url",
        type=str,
        default=None,
        help="Server or API base url (overrides --host/--port).",
    )
    parser.add_argument("--host", type=str, default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--endpoint", type=str, default=None, help="API endpoint (default: by backend)."
    )
    parser.add_argument(
        "--model",
        type=str,
        default=None,
        help="Model name sent in requests (default: the server's first).",
    )
    parser.add_argument(
        "--tokenizer",
        type=str,
        default=None,
        help="Tokenizer for the random prompts (default: --model, else the served model's path).",
    )
    parser.add_argument("--dataset-name", type=str, default="random", choices=["random"])
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--random-input-len", type=int, default=1024)
    parser.add_argument("--random-output-len", type=int, default=128)
    parser.add_argument("--random-range-ratio", type=float, default=0.0)
    parser.add_argument("--random-prefix-len", type=int, default=0)
    parser.add_argument(
        "--request-rate",
        type=float,
        default=float("inf"),
        help="Requests per second; inf sends them all at once.",
    )
    parser.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="Gamma shape of inter-arrival times (1 = Poisson).",
    )
    parser.add_argument(
        "--max-concurrency", type=int, default=None, help="Most requests in flight at once."
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--ignore-eos",
        action="store_true",
        help="Generate exactly the requested lengths (vLLM extension).",
    )
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument(
        "--percentile-metrics",
        type=str,
        default="ttft,tpot,itl,e2el",
        help="Comma-separated metrics to report percentiles of.",
    )
    parser.add_argument(
        "--metric-percentiles",
        type=str,
        default="99",
        help="Comma-separated percentiles to report.",
    )
    parser.add_argument(
        "--api-key", type=str, default=None, help="Sent as `Authorization: Bearer <key>`."
    )
    parser.add_argument("--save-result", action="store_true")
    parser.add_argument("--result-filename", type=str, default=None)
    parser.add_argument("--disable-tqdm", action="store_true")


@dataclass
class BenchmarkMetrics:
    completed: int
    failed: int
    total_input: int
    total_output: int
    duration: float
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float
    max_concurrent_requests: int
    # metric -> {"mean": ms, "median": ms, "p99": ms, ...}
    percentiles: dict[str, dict[str, float]] = field(default_factory=dict)


async def get_request(
    requests: list[SampleRequest], request_rate: float, burstiness: float, rng: np.random.Generator
) -> AsyncIterator[SampleRequest]:
    """Yield requests at the given rate (gamma-distributed gaps, mean 1/rate)."""
    for request in requests:
        yield request
        if request_rate == float("inf"):
            continue
        theta = 1.0 / (request_rate * burstiness)
        await asyncio.sleep(rng.gamma(shape=burstiness, scale=theta))


def calculate_metrics(
    inputs: list[RequestFuncInput],
    outputs: list[RequestFuncOutput],
    duration: float,
    selected: list[str],
    percentiles: list[float],
) -> BenchmarkMetrics:
    ok = [(i, o) for i, o in zip(inputs, outputs) if o.success]
    values: dict[str, list[float]] = {"ttft": [], "tpot": [], "itl": [], "e2el": []}
    total_output = 0
    for _, out in ok:
        total_output += out.output_tokens
        values["ttft"].append(out.ttft)
        values["e2el"].append(out.latency)
        values["itl"].extend(out.itl)
        if out.output_tokens > 1:
            values["tpot"].append((out.latency - out.ttft) / (out.output_tokens - 1))
    total_input = sum(i.prompt_len for i, _ in ok)
    stats = {}
    for name in selected:
        data = np.asarray(values[name] or [0.0]) * 1000.0  # ms
        stats[name] = {
            "mean": float(np.mean(data)),
            "median": float(np.median(data)),
            **{f"p{p:g}": float(np.percentile(data, p)) for p in percentiles},
        }
    return BenchmarkMetrics(
        completed=len(ok),
        failed=len(outputs) - len(ok),
        total_input=total_input,
        total_output=total_output,
        duration=duration,
        request_throughput=len(ok) / duration,
        output_throughput=total_output / duration,
        total_token_throughput=(total_input + total_output) / duration,
        max_output_tokens_per_s=_peak_tokens_per_second([o for _, o in ok]),
        max_concurrent_requests=_peak_concurrency([o for _, o in ok]),
        percentiles=stats,
    )


def _peak_tokens_per_second(outputs: list[RequestFuncOutput]) -> float:
    """Most tokens received within one wall-clock second (1 s bins)."""
    stamps = [t for o in outputs for t in o.token_timestamps]
    if not stamps:
        return 0.0
    start = min(stamps)
    counts = np.bincount(((np.asarray(stamps) - start) // 1.0).astype(int))
    return float(counts.max())


def _peak_concurrency(outputs: list[RequestFuncOutput]) -> int:
    events = sorted(
        [(o.start_time, 1) for o in outputs] + [(o.start_time + o.latency, -1) for o in outputs]
    )
    peak = current = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak


async def benchmark(
    args: argparse.Namespace,
    api_url: str,
    model: str,
    requests: list[SampleRequest],
    prompts: list[Any],
) -> tuple[BenchmarkMetrics, list[RequestFuncOutput]]:
    import aiohttp

    request_func = BACKENDS[args.backend]
    semaphore = asyncio.Semaphore(args.max_concurrency or len(requests))
    rng = np.random.default_rng(args.seed)
    extra = {"ignore_eos": True} if args.ignore_eos else {}
    if args.temperature is not None:
        extra["temperature"] = args.temperature
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    inputs: list[RequestFuncInput] = []
    tasks = []
    timeout = aiohttp.ClientTimeout(total=6 * 60 * 60)
    async with aiohttp.ClientSession(
        timeout=timeout, headers=headers, connector=aiohttp.TCPConnector(limit=0)
    ) as session:

        async def limited(req_input: RequestFuncInput) -> RequestFuncOutput:
            async with semaphore:
                return await request_func(req_input, session)

        start = time.perf_counter()
        index = {id(r): i for i, r in enumerate(requests)}
        async for request in get_request(requests, args.request_rate, args.burstiness, rng):
            req_input = RequestFuncInput(
                prompt=prompts[index[id(request)]],
                api_url=api_url,
                model=model,
                prompt_len=request.prompt_len,
                output_len=request.expected_output_len,
                extra_body=extra,
            )
            inputs.append(req_input)
            tasks.append(asyncio.create_task(limited(req_input)))
        outputs = await _gather_with_progress(tasks, args.disable_tqdm)
        duration = time.perf_counter() - start
    selected = [m.strip() for m in args.percentile_metrics.split(",") if m.strip()]
    percentiles = [float(p) for p in args.metric_percentiles.split(",")]
    return calculate_metrics(inputs, outputs, duration, selected, percentiles), outputs


async def _gather_with_progress(
    tasks: list[asyncio.Task], disable: bool
) -> list[RequestFuncOutput]:
    from tqdm.auto import tqdm

    pbar = None if disable else tqdm(total=len(tasks))
    for future in asyncio.as_completed(tasks):
        await future
        if pbar is not None:
            pbar.update(1)
    if pbar is not None:
        pbar.close()
    return [t.result() for t in tasks]


_TITLES = {
    "ttft": ("Time to First Token", "TTFT"),
    "tpot": ("Time per Output Token (excl. 1st token)", "TPOT"),
    "itl": ("Inter-token Latency", "ITL"),
    "e2el": ("End-to-end Latency", "E2EL"),
}


def print_metrics(
    metrics: BenchmarkMetrics, max_concurrency: int | None, request_rate: float
) -> None:
    """Upstream's summary block."""
    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    rows: list[tuple[str, Any]] = [
        ("Successful requests:", metrics.completed),
        ("Failed requests:", metrics.failed),
    ]
    if max_concurrency is not None:
        rows.append(("Maximum request concurrency:", max_concurrency))
    if request_rate != float("inf"):
        rows.append(("Request rate configured (RPS):", f"{request_rate:.2f}"))
    rows += [
        ("Benchmark duration (s):", f"{metrics.duration:.2f}"),
        ("Total input tokens:", metrics.total_input),
        ("Total generated tokens:", metrics.total_output),
        ("Request throughput (req/s):", f"{metrics.request_throughput:.2f}"),
        ("Output token throughput (tok/s):", f"{metrics.output_throughput:.2f}"),
        ("Peak output token throughput (tok/s):", f"{metrics.max_output_tokens_per_s:.2f}"),
        ("Peak concurrent requests:", f"{metrics.max_concurrent_requests:.2f}"),
        ("Total Token throughput (tok/s):", f"{metrics.total_token_throughput:.2f}"),
    ]
    for label, value in rows:
        print(f"{label:<40} {value:<10}")
    for name, stats in metrics.percentiles.items():
        title, short = _TITLES[name]
        print("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        print("{:<40} {:<10.2f}".format(f"Mean {short} (ms):", stats["mean"]))
        print("{:<40} {:<10.2f}".format(f"Median {short} (ms):", stats["median"]))
        for key, value in stats.items():
            if key.startswith("p"):
                print("{:<40} {:<10.2f}".format(f"P{key[1:]} {short} (ms):", value))
    print("=" * 50)


def main(args: argparse.Namespace) -> None:
    if not 0.0 <= args.random_range_ratio < 1.0:
        raise ValueError("--random-range-ratio must be in [0, 1).")
    base_url = args.base_url or f"http://{args.host}:{args.port}"
    endpoint = args.endpoint or DEFAULT_ENDPOINTS[args.backend]
    served_name, served_root = fetch_model_info(base_url, args.api_key)
    model = args.model or served_name
    tokenizer = _load_tokenizer(args.tokenizer or args.model or served_root)
    requests = sample_random_requests(
        len(tokenizer),
        set(tokenizer.all_special_ids),
        args.num_prompts,
        args.random_input_len,
        args.random_output_len,
        args.random_range_ratio,
        args.random_prefix_len,
        args.seed,
    )
    # Completions take token ids as they are; chat needs text.
    prompts = (
        [tokenizer.decode(r.prompt_token_ids) for r in requests]
        if args.backend == "openai-chat"
        else [r.prompt_token_ids for r in requests]
    )
    random.seed(args.seed)
    print(
        f"Benchmarking {model} at {base_url}{endpoint}: {args.num_prompts} prompts, "
        f"request rate {args.request_rate}, max concurrency {args.max_concurrency}"
    )
    metrics, outputs = asyncio.run(benchmark(args, base_url + endpoint, model, requests, prompts))
    print_metrics(metrics, args.max_concurrency, args.request_rate)
    errors = [o.error for o in outputs if not o.success]
    if errors:
        print(f"First error of {len(errors)}: {errors[0][:500]}")
    if args.save_result:
        filename = args.result_filename or f"bench-serve-{int(time.time())}.json"
        result = {
            "backend": args.backend,
            "model_id": model,
            "num_prompts": args.num_prompts,
            "request_rate": args.request_rate,
            "max_concurrency": args.max_concurrency,
            **asdict(metrics),
        }
        with open(filename, "w") as f:
            json.dump(result, f, indent=2)


def _load_tokenizer(path: str) -> TokenizerLike:
    from vllm.transformers_utils.tokenizer import get_tokenizer

    return get_tokenizer(path)
