"""Tensor parallelism offline: a model split over 2 workers, on the multiproc or the Ray executor.

    python examples/offline_inference/tensor_parallel.py [--model PATH] \
        [--tensor-parallel-size 2] [--distributed-executor-backend mp|ray]

Each worker holds half of every layer's heads and MLP columns; the workers
are processes started by vLLM (`mp`, torch.distributed over gloo on CPU) or
Ray actors (`ray`: a local Ray cluster is started when none is running).
The output is the same as with one worker.
"""

from vllm import LLM, EngineArgs, SamplingParams
from vllm.utils.argparse_utils import FlexibleArgumentParser

PROMPTS = ["Hello, my name is", "The capital of France is"]


def parse_args() -> dict:
    parser = FlexibleArgumentParser(description=__doc__.splitlines()[0])
    EngineArgs.add_cli_args(parser)
    parser.set_defaults(
        max_model_len=512, tensor_parallel_size=2, distributed_executor_backend="mp"
    )
    parser.add_argument("--max-tokens", type=int, default=16)
    return vars(parser.parse_args())


def main() -> None:
    args = parse_args()
    params = SamplingParams(temperature=0.0, max_tokens=args.pop("max_tokens"))
    llm = LLM(**args)
    print(
        f"executor: {args['distributed_executor_backend']}, "
        f"tensor_parallel_size: {args['tensor_parallel_size']}"
    )
    for out in llm.generate(PROMPTS, params, use_tqdm=False):
        print(f"Prompt: {out.prompt!r} -> {out.outputs[0].text!r}")


if __name__ == "__main__":
    main()
