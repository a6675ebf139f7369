"""Multi-LoRA offline: one base model, requests with and without LoRA adapters in the same batch.

    python examples/offline_inference/multilora_inference.py --model BASE \
        --lora-path ADAPTER_DIR [--lora-path ADAPTER_DIR2 ...]

Each adapter is a local peft directory (`adapter_config.json` and its
weights) trained for BASE. `--enable-lora` is on here, and `--max-loras`
bounds how many adapters one step may mix; every request names its adapter
with a `LoRARequest(name, unique int id, path)`, or none for the base model.
"""

from vllm import LLM, EngineArgs, SamplingParams
from vllm.lora.request import LoRARequest
from vllm.utils.argparse_utils import FlexibleArgumentParser

PROMPT = "The capital of France is"


def parse_args() -> dict:
    parser = FlexibleArgumentParser(description=__doc__.splitlines()[0])
    EngineArgs.add_cli_args(parser)
    parser.set_defaults(max_model_len=512, enable_lora=True, max_loras=2, max_lora_rank=16)
    parser.add_argument("--lora-path", action="append", required=True, help="a peft adapter dir")
    parser.add_argument("--max-tokens", type=int, default=16)
    return vars(parser.parse_args())


def main() -> None:
    args = parse_args()
    paths = args.pop("lora_path")
    params = SamplingParams(temperature=0.0, max_tokens=args.pop("max_tokens"))
    llm = LLM(**args)
    loras: list[LoRARequest | None] = [None]
    loras += [LoRARequest(f"adapter{i}", i + 1, path) for i, path in enumerate(paths)]
    outputs = llm.generate([PROMPT] * len(loras), params, use_tqdm=False, lora_request=loras)
    for lora, out in zip(loras, outputs):
        name = lora.lora_name if lora is not None else "base model"
        print(f"{name}: {out.outputs[0].text!r}")


if __name__ == "__main__":
    main()
