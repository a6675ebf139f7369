"""Beam search offline with `LLM.beam_search`: the `beam_width` most likely continuations.

    python examples/offline_inference/beam_search.py [--model PATH] [--beam-width N]

Each returned sequence carries its token ids, text and cumulative
log-probability; they come ranked (length-penalised), best first.
"""

from vllm import LLM, EngineArgs
from vllm.sampling_params import BeamSearchParams
from vllm.utils.argparse_utils import FlexibleArgumentParser

PROMPTS = ["The capital of France is", "The best way to learn a language is"]


def parse_args() -> dict:
    parser = FlexibleArgumentParser(description=__doc__.splitlines()[0])
    EngineArgs.add_cli_args(parser)
    parser.set_defaults(max_model_len=512)
    parser.add_argument("--beam-width", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=16)
    return vars(parser.parse_args())


def main() -> None:
    args = parse_args()
    params = BeamSearchParams(beam_width=args.pop("beam_width"), max_tokens=args.pop("max_tokens"))
    llm = LLM(**args)
    for prompt, output in zip(PROMPTS, llm.beam_search(PROMPTS, params)):
        print(f"Prompt: {prompt!r}")
        for rank, seq in enumerate(output.sequences):
            print(f"  beam {rank}: logprob={seq.cum_logprob:.3f} text={seq.text!r}")


if __name__ == "__main__":
    main()
