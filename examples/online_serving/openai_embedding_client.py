"""The `openai` client against `vllm serve`: /v1/embeddings for a batch of texts.

    vllm serve EMBEDDING_MODEL            # or: vllm serve GEN --embedding-model EMB
    python examples/online_serving/openai_embedding_client.py

The model is `--model`, else the server's first model whose card lists the
"embed" task (`supported_tasks`), else its first model. Each input gets one
vector (`data[i].embedding`), in input order.
"""

from __future__ import annotations

import argparse

from openai import OpenAI

TEXTS = ["Hello, my name is", "The capital of France is", "The future of AI is"]


def pick_model(client: OpenAI) -> str:
    cards = client.models.list().data
    for card in cards:
        if "embed" in (getattr(card, "supported_tasks", None) or []):
            return card.id
    return cards[0].id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://localhost:8000/v1")
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key="EMPTY")
    model = args.model or pick_model(client)
    response = client.embeddings.create(model=model, input=TEXTS)
    for text, item in zip(TEXTS, response.data):
        head = ", ".join(f"{x:.4f}" for x in item.embedding[:4])
        print(f"{text!r}: index={item.index} dim={len(item.embedding)} [{head}, ...]")
    print("usage:", response.usage)


if __name__ == "__main__":
    main()
