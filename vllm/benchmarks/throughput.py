"""Offline throughput benchmark: `vllm bench throughput` (upstream: vllm/benchmarks/throughput.py).

Builds a random dataset (prompts of `--input-len` random token ids, each to
generate exactly `--output-len` tokens), runs it through `LLM.generate` in
one call and prints upstream's summary line:

    Throughput: X requests/s, Y total tokens/s, Z output tokens/s
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from dataclasses import dataclass

from vllm.engine.arg_utils import EngineArgs


@dataclass
class SampleRequest:
    """One benchmark request: its prompt and how many tokens it must produce."""

    prompt_token_ids: list[int]
    prompt_len: int
    expected_output_len: int


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", type=str, choices=["vllm"], default="vllm")
    parser.add_argument(
        "--dataset-name",
        type=str,
        choices=["random"],
        default="random",
        help="Name of the dataset to benchmark on (only 'random' is built).",
    )
    parser.add_argument(
        "--dataset-path",
        type=str,
        default=None,
        help="Path to a dataset file (not supported yet: random only).",
    )
    parser.add_argument(
        "--input-len", type=int, default=None, help="Input prompt length for each request."
    )
    parser.add_argument(
        "--output-len", type=int, default=None, help="Output length for each request."
    )
    parser.add_argument(
        "--n", type=int, default=1, help="Number of generated sequences per prompt."
    )
    parser.add_argument(
        "--num-prompts", type=int, default=1000, help="Number of prompts to process."
    )
    parser.add_argument(
        "--num-warmups", type=int, default=0, help="Number of warmup requests, run before timing."
    )
    parser.add_argument(
        "--output-json",
        type=str,
        default=None,
        help="Path to save the throughput results in JSON format.",
    )
    parser.add_argument(
        "--disable-detokenize",
        action="store_true",
        help="Do not detokenize the outputs (not counted in the timing).",
    )
    parser.add_argument(
        "--random-input-len",
        type=int,
        default=1024,
        help="Random dataset: prompt length (--input-len overrides).",
    )
    parser.add_argument(
        "--random-output-len",
        type=int,
        default=128,
        help="Random dataset: output length (--output-len overrides).",
    )
    parser.add_argument(
        "--random-range-ratio",
        type=float,
        default=0.0,
        help="Random dataset: lengths are drawn uniformly from [len * (1 - r), len * (1 + r)].",
    )
    parser.add_argument(
        "--random-prefix-len",
        type=int,
        default=0,
        help="Random dataset: a shared prefix of this many tokens.",
    )
    parser.add_argument(
        "--prefix-len", type=int, default=None, help="Alias of --random-prefix-len."
    )
    # Engine flags; --seed seeds the random dataset too.
    EngineArgs.add_cli_args(parser)


def validate_args(args: argparse.Namespace) -> None:
    if args.dataset_path is not None:
        raise ValueError(
            "Only the random dataset is supported yet (--dataset-name random, no --dataset-path)."
        )
    if args.input_len is not None:
        args.random_input_len = args.input_len
    if args.output_len is not None:
        args.random_output_len = args.output_len
    if args.prefix_len is not None:
        args.random_prefix_len = args.prefix_len
    if not 0.0 <= args.random_range_ratio < 1.0:
        raise ValueError("--random-range-ratio must be in [0, 1).")
    if args.n != 1:
        raise ValueError("--n > 1 needs parallel sampling, which is not built yet.")
    if args.num_prompts < 1 or args.random_input_len < 1 or args.random_output_len < 1:
        raise ValueError("--num-prompts, --input-len and --output-len must be positive.")


def sample_random_requests(
    vocab_size: int,
    special_ids: set[int],
    num_requests: int,
    input_len: int,
    output_len: int,
    range_ratio: float = 0.0,
    prefix_len: int = 0,
    seed: int = 0,
) -> list[SampleRequest]:
    """Random prompts of ordinary (non-special) token ids."""
    rng = random.Random(seed)
    pool = [t for t in range(vocab_size) if t not in special_ids]
    prefix = [rng.choice(pool) for _ in range(prefix_len)]
    requests = []
    for _ in range(num_requests):
        n_in = rng.randint(int(input_len * (1 - range_ratio)), int(input_len * (1 + range_ratio)))
        n_out = rng.randint(
            int(output_len * (1 - range_ratio)), int(output_len * (1 + range_ratio))
        )
        ids = prefix + [rng.choice(pool) for _ in range(max(n_in, 1))]
        requests.append(SampleRequest(ids, len(ids), max(n_out, 1)))
    return requests


def run_vllm(
    requests: list[SampleRequest],
    engine_args: EngineArgs,
    disable_detokenize: bool,
    num_warmups: int = 0,
) -> tuple[float, list]:
    """Generate all requests in one `LLM.generate`; (elapsed seconds, outputs)."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(**dataclasses.asdict(engine_args))
    max_len = llm.llm_engine.model_config.max_model_len
    if any(r.prompt_len + r.expected_output_len > max_len for r in requests):
        raise ValueError(
            "Please ensure that max_model_len is greater than the sum of "
            "prompt_len and expected_output_len for all requests."
        )
    prompts = [TokensPrompt(prompt_token_ids=r.prompt_token_ids) for r in requests]
    params = [
        SamplingParams(
            n=1,
            temperature=1.0,
            top_p=1.0,
            ignore_eos=True,
            max_tokens=r.expected_output_len,
            detokenize=not disable_detokenize,
        )
        for r in requests
    ]
    if num_warmups > 0:
        llm.generate(prompts[:num_warmups], params[:num_warmups], use_tqdm=False)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=True)
    return time.perf_counter() - start, outputs


def main(args: argparse.Namespace) -> None:
    validate_args(args)
    engine_args = EngineArgs.from_cli_args(args)
    vocab_size, special_ids = _vocab_of(engine_args)
    requests = sample_random_requests(
        vocab_size,
        special_ids,
        args.num_prompts,
        args.random_input_len,
        args.random_output_len,
        args.random_range_ratio,
        args.random_prefix_len,
        args.seed,
    )
    elapsed, outputs = run_vllm(requests, engine_args, args.disable_detokenize, args.num_warmups)
    total_prompt = sum(len(o.prompt_token_ids or []) for o in outputs)
    total_output = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    total = total_prompt + total_output
    print(
        f"Throughput: {len(requests) / elapsed:.2f} requests/s, "
        f"{total / elapsed:.2f} total tokens/s, "
        f"{total_output / elapsed:.2f} output tokens/s"
    )
    print(f"Total num prompt tokens:  {total_prompt}")
    print(f"Total num output tokens:  {total_output}")
    if args.output_json:
        results = {
            "model_id": engine_args.model,
            "elapsed_time": elapsed,
            "num_requests": len(requests),
            "total_num_tokens": total,
            "requests_per_second": len(requests) / elapsed,
            "tokens_per_second": total / elapsed,
        }
        with open(args.output_json, "w") as f:
            json.dump(results, f, indent=4)


def _vocab_of(engine_args: EngineArgs) -> tuple[int, set[int]]:
    """The model's vocabulary size and the tokenizer's special ids (kept out of prompts)."""
    from vllm.transformers_utils.tokenizer import cached_tokenizer_from_config

    model_config = engine_args.create_model_config()
    special: set[int] = set()
    if not model_config.skip_tokenizer_init:
        special = set(cached_tokenizer_from_config(model_config).all_special_ids)
    return model_config.get_vocab_size(), special
