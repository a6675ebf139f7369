"""Latency of one batch: `vllm bench latency` (upstream: vllm/benchmarks/latency.py).

Generates `--batch-size` random prompts of `--input-len` tokens, each to
exactly `--output-len` tokens, `--num-iters` times after `--num-iters-warmup`
untimed runs, and prints the mean and the 10/25/50/75/90/99% latencies.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np
from tqdm import tqdm

from vllm.engine.arg_utils import EngineArgs

PERCENTAGES = [10, 25, 50, 75, 90, 99]


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument(
        "--n", type=int, default=1, help="Number of generated sequences per prompt."
    )
    parser.add_argument(
        "--num-iters-warmup", type=int, default=10, help="Number of iterations to run for warmup."
    )
    parser.add_argument("--num-iters", type=int, default=30, help="Number of iterations to run.")
    parser.add_argument(
        "--output-json",
        type=str,
        default=None,
        help="Path to save the latency results in JSON format.",
    )
    parser.add_argument(
        "--disable-detokenize",
        action="store_true",
        help="Do not detokenize responses (i.e. do not include "
        "detokenization time in the latency measurement)",
    )
    EngineArgs.add_cli_args(parser)
    # Prefix caching would let iterations after the first skip the prefill
    # of the same prompts, which skews the numbers: off by default here.
    parser.set_defaults(enable_prefix_caching=False)


def main(args: argparse.Namespace) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    if args.n < 1:
        raise ValueError(f"--n must be at least 1, got {args.n}.")
    engine_args = EngineArgs.from_cli_args(args)
    llm = LLM(**dataclasses.asdict(engine_args))
    model_config = llm.llm_engine.model_config
    if model_config.max_model_len < args.input_len + args.output_len:
        raise ValueError(
            "Please ensure that max_model_len is greater than the sum of input_len and output_len."
        )
    params = SamplingParams(
        n=args.n,
        temperature=1.0,
        top_p=1.0,
        ignore_eos=True,
        max_tokens=args.output_len,
        detokenize=not args.disable_detokenize,
    )
    # Random ids below min(vocab, 10000), as upstream draws them.
    rng = np.random.default_rng(args.seed)
    ids = rng.integers(
        min(model_config.get_vocab_size(), 10000), size=(args.batch_size, args.input_len)
    )
    prompts = [TokensPrompt(prompt_token_ids=row) for row in ids.tolist()]

    def run_to_completion() -> float:
        start = time.perf_counter()
        llm.generate(prompts, sampling_params=params, use_tqdm=False)
        return time.perf_counter() - start

    print("Warming up...")
    for _ in tqdm(range(args.num_iters_warmup), desc="Warmup iterations"):
        run_to_completion()
    latencies = np.array(
        [run_to_completion() for _ in tqdm(range(args.num_iters), desc="Bench iterations")]
    )
    percentiles = np.percentile(latencies, PERCENTAGES)
    print(f"Avg latency: {np.mean(latencies)} seconds")
    for percentage, value in zip(PERCENTAGES, percentiles):
        print(f"{percentage}% percentile latency: {value} seconds")
    if args.output_json:
        results = {
            "avg_latency": float(np.mean(latencies)),
            "latencies": latencies.tolist(),
            "percentiles": dict(zip(PERCENTAGES, percentiles.tolist())),
        }
        with open(args.output_json, "w") as f:
            json.dump(results, f, indent=4)
