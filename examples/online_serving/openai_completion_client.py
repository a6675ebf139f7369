"""The `openai` client against `vllm serve`: /v1/completions, whole or streamed (`--stream`).

    vllm serve            # the embedded model on localhost:8000
    python examples/online_serving/openai_completion_client.py [--stream]

The model is the server's first one (`client.models.list()`) unless
`--model` names it. Streamed, the text arrives as chunks of
`choices[0].text`; the last chunk carries the finish_reason, and with
`stream_options={"include_usage": True}` a final chunk carries the usage.
"""

from __future__ import annotations

import argparse

from openai import OpenAI


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://localhost:8000/v1")
    parser.add_argument("--model", default=None, help="default: the server's first model")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--stream", action="store_true")
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key="EMPTY")
    model = args.model or client.models.list().data[0].id
    request = dict(
        model=model,
        prompt=["A robot may not injure a human being", "The capital of France is"],
        max_tokens=args.max_tokens,
        temperature=0.0,
        echo=False,
    )
    if not args.stream:
        completion = client.completions.create(**request)
        for choice in completion.choices:
            print(f"choice {choice.index}: {choice.text!r} ({choice.finish_reason})")
        print("usage:", completion.usage)
        return
    texts: dict[int, str] = {}
    stream = client.completions.create(
        stream=True, stream_options={"include_usage": True}, **request
    )
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.finish_reason is not None:
                print(f"streamed choice {choice.index}: {texts[choice.index]!r}")
        if chunk.usage is not None:
            print("usage:", chunk.usage)


if __name__ == "__main__":
    main()
