"""Data-parallel scaling on one machine: `vllm serve -dp 2` against `-dp 1`
(issue 20; a benchmark, not a test).

For each DP size, in one run on the same machine, the script starts a real
`vllm serve` subprocess (one API server, `--api-server-count 1`) and
measures over HTTP:

  throughput   N concurrent completions (prompt token ids, max_tokens T,
               ignore_eos): output tokens / wall second, and request rate;
  overhead     sequential 1-token requests (nothing to batch with): the
               median end-to-end latency, i.e. the per-request cost of the
               front end, the ZMQ hops, the load balancer and one tiny
               forward pass; with -dp 2 the difference to -dp 1 is what the
               DP client and the coordinator add per request.

With a model as small as the test models nearly all of the time is per-
request and per-step overhead, which is the point on a 2-core box: two
engines share two cores, so compute does not scale; what a multi-node
deployment gains is estimated from the measured overhead (see the printed
reasoning). Results go to benchmarks/results/dp_scaling_<tag>_<date>.{json,log}.

    python benchmarks/benchmark_dp_scaling.py --model /path/to/model \\
        [--dp-sizes 1 2] [--num-prompts 64] [--output-len 64] [--tag cpu2c]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from tests.entrypoints.openai.conftest import RemoteOpenAIServer  # noqa: E402


def _prompt(i: int, length: int) -> list[int]:
    return [(7 * i + j) % 200 + 1 for j in range(length)]


async def _throughput(srv: RemoteOpenAIServer, model: str, args: argparse.Namespace) -> dict:
    body = {"model": model, "max_tokens": args.output_len, "temperature": 0, "ignore_eos": True}
    limits = httpx.Limits(max_connections=args.num_prompts)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        t0 = time.perf_counter()
        responses = await asyncio.gather(
            *[
                client.post(
                    srv.url_for("v1/completions"),
                    json={**body, "prompt": _prompt(i, args.input_len)},
                )
                for i in range(args.num_prompts)
            ]
        )
        wall = time.perf_counter() - t0
    tokens = sum(r.json()["usage"]["completion_tokens"] for r in responses if r.status_code == 200)
    return {
        "wall_s": wall,
        "ok": sum(r.status_code == 200 for r in responses),
        "output_tokens": tokens,
        "output_tok_per_s": tokens / wall,
        "req_per_s": args.num_prompts / wall,
    }


def _overhead(srv: RemoteOpenAIServer, model: str, args: argparse.Namespace) -> dict:
    latencies = []
    with httpx.Client(timeout=120) as client:
        for i in range(args.overhead_requests + 3):
            t0 = time.perf_counter()
            r = client.post(
                srv.url_for("v1/completions"),
                json={"model": model, "prompt": _prompt(i, 8), "max_tokens": 1, "temperature": 0},
            )
            r.raise_for_status()
            if i >= 3:  # warm-up
                latencies.append(time.perf_counter() - t0)
    return {
        "median_ms": 1000 * statistics.median(latencies),
        "p90_ms": 1000 * sorted(latencies)[int(0.9 * (len(latencies) - 1))],
        "n": len(latencies),
    }


def _engine_spread(srv: RemoteOpenAIServer) -> dict[str, float]:
    """Successful requests per engine label (from /metrics)."""
    spread: dict[str, float] = {}
    for line in httpx.get(srv.url_for("metrics"), timeout=10).text.splitlines():
        if line.startswith("vllm:request_success_total{"):
            engine = line.split('engine="', 1)[1].split('"', 1)[0]
            spread[engine] = spread.get(engine, 0.0) + float(line.rsplit(" ", 1)[1])
    return spread


def run_one(dp: int, args: argparse.Namespace) -> dict:
    serve_args = [
        "--dtype",
        args.dtype,
        "--max-model-len",
        str(args.max_model_len),
        "--kv-cache-memory-bytes",
        str(args.kv_cache_memory_bytes),
        "--api-server-count",
        "1",
        "-dp",
        str(dp),
    ]
    t0 = time.perf_counter()
    env = dict(kv.split("=", 1) for kv in args.env)
    srv = RemoteOpenAIServer(args.model, serve_args, env=env, log_path=args.server_log, wait=False)
    srv.wait_until_healthy(timeout=600)  # two engines loading on a busy 2-core box
    startup = time.perf_counter() - t0
    try:
        overhead = _overhead(srv, args.model, args)
        throughput = asyncio.run(_throughput(srv, args.model, args))
        spread = _engine_spread(srv)
    finally:
        srv.stop()
    return {
        "dp": dp,
        "startup_s": startup,
        "overhead": overhead,
        "throughput": throughput,
        "spread": spread,
    }


def _report(results: list[dict], args: argparse.Namespace) -> str:
    header = (
        f"model={args.model} input_len={args.input_len} output_len={args.output_len} "
        f"num_prompts={args.num_prompts} dtype={args.dtype} env={args.env}"
    )
    lines = [header]
    for r in results:
        t, o = r["throughput"], r["overhead"]
        lines.append(
            f"-dp {r['dp']}: startup {r['startup_s']:.1f} s; throughput "
            f"{t['output_tok_per_s']:.1f} output tok/s, {t['req_per_s']:.2f} req/s "
            f"({t['ok']}/{args.num_prompts} ok, {t['wall_s']:.1f} s); 1-token request "
            f"median {o['median_ms']:.1f} ms, p90 {o['p90_ms']:.1f} ms; "
            f"requests per engine {r['spread']}"
        )
    by_dp = {r["dp"]: r for r in results}
    if 1 in by_dp and 2 in by_dp:
        one, two = by_dp[1], by_dp[2]
        ratio = two["throughput"]["output_tok_per_s"] / one["throughput"]["output_tok_per_s"]
        extra = two["overhead"]["median_ms"] - one["overhead"]["median_ms"]
        lines.append(
            f"-dp 2 / -dp 1 throughput: {ratio:.2f}x; per-request latency added by the DP "
            f"client + coordinator path: {extra:+.1f} ms (median, 1-token requests)"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--dp-sizes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--overhead-requests", type=int, default=30)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-model-len", type=int, default=256)
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=64_000_000)
    parser.add_argument("--tag", default="cpu")
    parser.add_argument("--server-log", default=None)
    parser.add_argument(
        "--env",
        nargs="*",
        default=[],
        help="KEY=VALUE for the server, e.g. OMP_NUM_THREADS=1 (with -dp 2 each engine "
        "already gets cores / engines threads)",
    )
    args = parser.parse_args()
    results = [run_one(dp, args) for dp in args.dp_sizes]
    report = _report(results, args)
    print(report)
    out = REPO_ROOT / "benchmarks" / "results"
    stem = f"dp_scaling_{args.tag}_{datetime.date.today().isoformat()}"
    (out / f"{stem}.json").write_text(
        json.dumps({"args": vars(args), "results": results}, indent=2) + "\n"
    )
    (out / f"{stem}.log").write_text(report + "\n")


if __name__ == "__main__":
    main()
