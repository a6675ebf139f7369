"""Embeddings offline with `LLM.embed`: one vector per text, and their cosine similarities.

    python examples/offline_inference/embed.py --model PATH_TO_EMBEDDING_MODEL

`--runner pooling` (the default here) loads the model as a pooling model: a
sentence-transformers directory brings its pooling and normalization
(`modules.json`), another model gets its architecture's default pooler.
"""

from vllm import LLM, EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser

TEXTS = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]


def parse_args() -> dict:
    parser = FlexibleArgumentParser(description=__doc__.splitlines()[0])
    EngineArgs.add_cli_args(parser)
    parser.set_defaults(runner="pooling")
    return vars(parser.parse_args())


def main() -> None:
    llm = LLM(**parse_args())
    outputs = llm.embed(TEXTS, use_tqdm=False)
    vectors = [out.outputs.embedding for out in outputs]
    for text, vec in zip(TEXTS, vectors):
        head = ", ".join(f"{x:.4f}" for x in vec[:4])
        print(f"{text!r}: dim={len(vec)} [{head}, ...]")
    norms = [sum(x * x for x in v) ** 0.5 for v in vectors]
    for i in range(1, len(vectors)):
        dot = sum(a * b for a, b in zip(vectors[0], vectors[i]))
        print(f"cosine({TEXTS[0]!r}, {TEXTS[i]!r}) = {dot / (norms[0] * norms[i]):.4f}")


if __name__ == "__main__":
    main()
