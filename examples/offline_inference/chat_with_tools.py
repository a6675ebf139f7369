"""Tool calling offline: tools in the chat template, the call read back as JSON and answered.

    python examples/offline_inference/chat_with_tools.py [--model PATH] [--chat-template FILE]

`LLM.chat(..., tools=TOOLS)` renders the tool definitions into the prompt
with the model's chat template. The call is constrained to a JSON schema
(structured outputs), so it parses even from a small model; the tool runs
and its result goes back as a `role: "tool"` message for the final answer.
(`vllm serve --enable-auto-tool-choice --tool-call-parser NAME` instead
parses free-form calls out of the text.)
"""

import json
from pathlib import Path

from vllm import LLM, EngineArgs, SamplingParams
from vllm.sampling_params import StructuredOutputsParams
from vllm.utils.argparse_utils import FlexibleArgumentParser

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "description": "Get the current weather in a given city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]}},
                "required": ["city"],
            },
        },
    }
]
# A call: {"name": <a tool's name>, "arguments": <its parameters>}.
CALL_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "enum": [t["function"]["name"] for t in TOOLS]},
        "arguments": {**TOOLS[0]["function"]["parameters"], "additionalProperties": False},
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}


def get_current_weather(city: str) -> str:
    return f"It is 21 degrees celsius and sunny in {city}."


def parse_args() -> dict:
    parser = FlexibleArgumentParser(description=__doc__.splitlines()[0])
    EngineArgs.add_cli_args(parser)
    parser.set_defaults(max_model_len=2048)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--chat-template", default=None, help="a Jinja chat template file")
    return vars(parser.parse_args())


def main() -> None:
    args = parse_args()
    max_tokens = args.pop("max_tokens")
    template_path = args.pop("chat_template")
    template = Path(template_path).read_text() if template_path else None
    llm = LLM(**args)
    messages = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    call_params = SamplingParams(
        temperature=0.0,
        max_tokens=max_tokens,
        structured_outputs=StructuredOutputsParams(json=CALL_SCHEMA, disable_any_whitespace=True),
    )
    (out,) = llm.chat(messages, call_params, use_tqdm=False, tools=TOOLS, chat_template=template)
    call = json.loads(out.outputs[0].text)
    print(f"tool call: {call['name']}({json.dumps(call['arguments'])})")
    result = get_current_weather(**call["arguments"])
    print(f"tool result: {result}")

    messages += [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call0",
                    "type": "function",
                    "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call0", "content": result},
    ]
    answer_params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    (final,) = llm.chat(
        messages, answer_params, use_tqdm=False, tools=TOOLS, chat_template=template
    )
    print(f"answer: {final.outputs[0].text!r}")


if __name__ == "__main__":
    main()
