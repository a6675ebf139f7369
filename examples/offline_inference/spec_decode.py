"""Speculative decoding offline: n-gram prompt-lookup drafts, verified in one pass.

    python examples/offline_inference/spec_decode.py [--model PATH] [--num-spec-tokens K]

The n-gram proposer needs no draft model: it looks the last few generated
tokens up in the prompt and proposes the tokens that followed them; the
target model verifies all K drafts in one forward pass. Greedy outputs are
the same as without speculation; repetitive text (code, quotes) gains most.
`vllm serve` with the same `--speculative-config` reports the acceptance
counters on /metrics (`vllm:spec_decode_num_accepted_tokens_total`, ...).
"""

from vllm import LLM, EngineArgs, SamplingParams
from vllm.utils.argparse_utils import FlexibleArgumentParser

PROMPTS = [
    (
        "Repeat after me: the quick brown fox jumps over the lazy dog. "
        "The quick brown fox jumps over the lazy dog. The quick brown fox"
    ),
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return",
]


def parse_args() -> dict:
    parser = FlexibleArgumentParser(description=__doc__.splitlines()[0])
    EngineArgs.add_cli_args(parser)
    parser.set_defaults(max_model_len=512)
    parser.add_argument("--num-spec-tokens", type=int, default=3)
    parser.add_argument("--prompt-lookup-min", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    return vars(parser.parse_args())


def main() -> None:
    args = parse_args()
    args["speculative_config"] = {
        "method": "ngram",
        "num_speculative_tokens": args.pop("num_spec_tokens"),
        "prompt_lookup_min": args.pop("prompt_lookup_min"),
    }
    params = SamplingParams(temperature=0.0, max_tokens=args.pop("max_tokens"), ignore_eos=True)
    llm = LLM(**args)
    for out in llm.generate(PROMPTS, params, use_tqdm=False):
        print(f"Prompt: {out.prompt[-40:]!r} -> {out.outputs[0].text!r}")


if __name__ == "__main__":
    main()
