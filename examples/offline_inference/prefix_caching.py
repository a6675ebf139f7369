"""Automatic prefix caching: prompts sharing a long prefix reuse its KV cache.

    python examples/offline_inference/prefix_caching.py [--model PATH]

The first batch computes the shared prefix (a long instruction) once per
block; the second batch, with the same prefix and new questions, finds those
blocks in the cache: `RequestOutput.num_cached_tokens` counts the prompt
tokens that were not computed again. Prefix caching is on by default
(`--no-enable-prefix-caching` turns it off).
"""

from vllm import LLM, EngineArgs, SamplingParams
from vllm.utils.argparse_utils import FlexibleArgumentParser

PREFIX = (
    "You are an expert school principal, skilled in effectively managing "
    "faculty and staff. Draft 10-15 questions for a potential first grade "
    "Head Teacher for my K-12, all-girls', independent school that emphasizes "
    "community, joy in learning, and education of the whole child. Answer the "
    "question below in one short sentence. "
)
FIRST = ["Hello, my name is", "The president of the United States is"]
SECOND = ["The capital of France is", "The future of AI is"]


def parse_args() -> dict:
    parser = FlexibleArgumentParser(description=__doc__.splitlines()[0])
    EngineArgs.add_cli_args(parser)
    parser.set_defaults(max_model_len=512, enable_prefix_caching=True)
    parser.add_argument("--max-tokens", type=int, default=16)
    return vars(parser.parse_args())


def main() -> None:
    args = parse_args()
    params = SamplingParams(temperature=0.0, max_tokens=args.pop("max_tokens"))
    llm = LLM(**args)
    for name, questions in (("first", FIRST), ("second", SECOND)):
        outputs = llm.generate([PREFIX + q for q in questions], params, use_tqdm=False)
        for q, out in zip(questions, outputs):
            print(
                f"{name} batch: {q!r} -> {out.outputs[0].text!r} "
                f"(prompt tokens: {len(out.prompt_token_ids or [])}, "
                f"cached: {out.num_cached_tokens})"
            )


if __name__ == "__main__":
    main()
