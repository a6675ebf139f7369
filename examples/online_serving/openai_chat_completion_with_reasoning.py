"""A thinking model's `reasoning` and `content`, apart, through the OpenAI client.

Start a server with the reasoning parser of the model's family:

    vllm serve Qwen/Qwen3-0.6B --reasoning-parser qwen3

Then run this file. Non-streamed, the reasoning is `message.reasoning` (an
extra field of the OpenAI client's message); streamed, it arrives as
`delta.reasoning` before the `delta.content` of the answer. With
`chat_template_kwargs: {"enable_thinking": false}` Qwen3 does not think, and a
`response_format` / structured-outputs grammar constrains only the content.
"""

from __future__ import annotations

import argparse

from openai import OpenAI


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://localhost:8000/v1")
    parser.add_argument("--max-tokens", type=int, default=512)
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key="EMPTY")
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "9.11 and 9.8, which is greater?"}]

    response = client.chat.completions.create(
        model=model, messages=messages, max_tokens=args.max_tokens
    )
    message = response.choices[0].message
    print("reasoning:", getattr(message, "reasoning", None))
    print("content:", message.content)

    reasoning, content = "", ""
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=args.max_tokens, stream=True
    )
    for chunk in stream:
        for choice in chunk.choices:
            reasoning += getattr(choice.delta, "reasoning", None) or ""
            content += choice.delta.content or ""
    print("streamed reasoning:", reasoning)
    print("streamed content:", content)


if __name__ == "__main__":
    main()
