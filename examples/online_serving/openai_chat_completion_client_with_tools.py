"""Tool calling with `tool_choice: "auto"` through the OpenAI client.

Start a server whose model writes tool calls, with the parser of its format:

    vllm serve NousResearch/Hermes-3-Llama-3.1-8B \
        --enable-auto-tool-choice --tool-call-parser hermes

Then run this file. The model decides whether to call `get_current_weather`;
a call comes back as `message.tool_calls` (arguments as JSON text) with
finish_reason "tool_calls", the result goes back as a `role: "tool"` message,
and the model answers with it. The same request streamed: the call arrives as
`delta.tool_calls` pieces (the first carries id and name), joined here.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "description": "Get the current weather in a given city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city, e.g. 'Paris'"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    }
]


def get_current_weather(city: str, unit: str = "celsius") -> str:
    return f"It is 21 degrees {unit} and sunny in {city}."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://localhost:8000/v1")
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key="EMPTY")
    model = client.models.list().data[0].id
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "What is the weather like in Paris today?"}
    ]
    common: dict[str, Any] = dict(model=model, tools=TOOLS, max_tokens=args.max_tokens)

    response = client.chat.completions.create(messages=messages, tool_choice="auto", **common)
    message = response.choices[0].message
    print("finish_reason:", response.choices[0].finish_reason)
    print("content:", message.content)
    for call in message.tool_calls or []:
        print(f"tool call: {call.function.name}({call.function.arguments}) id={call.id}")

    if message.tool_calls:
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = get_current_weather(**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        final = client.chat.completions.create(messages=messages, **common)
        print("answer:", final.choices[0].message.content)

    calls: dict[int, dict[str, str]] = {}
    content = ""
    for chunk in client.chat.completions.create(messages=messages[:1], stream=True, **common):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for piece in choice.delta.tool_calls or []:
                call = calls.setdefault(piece.index, {"name": "", "arguments": ""})
                call["name"] += piece.function.name or ""
                call["arguments"] += piece.function.arguments or ""
    print("streamed content:", content)
    print("streamed tool calls:", list(calls.values()))


if __name__ == "__main__":
    main()
