"""The `openai` client against `vllm serve`: /v1/chat/completions, whole or streamed (`--stream`).

    vllm serve            # the embedded model on localhost:8000
    python examples/online_serving/openai_chat_completion_client.py [--stream]

A conversation with a system prompt and one turn of history; the server
renders it with the model's chat template. Streamed, the answer arrives as
`delta.content` pieces (the first chunk carries `delta.role`).
"""

from __future__ import annotations

import argparse

from openai import OpenAI

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Who won the world series in 2020?"},
    {"role": "assistant", "content": "The Los Angeles Dodgers won the World Series in 2020."},
    {"role": "user", "content": "Where was it played?"},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://localhost:8000/v1")
    parser.add_argument("--model", default=None, help="default: the server's first model")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--stream", action="store_true")
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key="EMPTY")
    model = args.model or client.models.list().data[0].id
    request = dict(model=model, messages=MESSAGES, max_tokens=args.max_tokens, temperature=0.0)
    if not args.stream:
        response = client.chat.completions.create(**request)
        print("assistant:", repr(response.choices[0].message.content))
        print("finish_reason:", response.choices[0].finish_reason)
        print("usage:", response.usage)
        return
    content, role, finish = "", None, None
    for chunk in client.chat.completions.create(stream=True, **request):
        for choice in chunk.choices:
            role = role or choice.delta.role
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
    print(f"streamed {role}: {content!r}")
    print("finish_reason:", finish)


if __name__ == "__main__":
    main()
