"""Structured outputs offline: a choice, a regex, a JSON schema and a grammar constrain the text.

    python examples/offline_inference/structured_outputs.py [--model PATH]

Each request sets `SamplingParams(structured_outputs=StructuredOutputsParams(...))`;
the grammar backend (xgrammar) masks every token that would leave the
constraint, so even a small model's answer parses.
"""

import json

from vllm import LLM, EngineArgs, SamplingParams
from vllm.sampling_params import StructuredOutputsParams
from vllm.utils.argparse_utils import FlexibleArgumentParser

PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "enum": ["Ada", "Alan", "Grace"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
# A tiny EBNF grammar: an SQL query over one table.
SQL_GRAMMAR = """
root ::= "SELECT " column " FROM users WHERE age > " number
column ::= "name" | "email" | "age"
number ::= [1-9] [0-9]?
"""

CASES = {
    "choice": (
        "Is this review positive or negative? 'vLLM is wonderful!'",
        {"choice": ["positive", "negative"]},
    ),
    "regex": ("Write an email address for Alan Turing:", {"regex": r"[a-z]{2,8}@[a-z]{2,8}\.com"}),
    "json": (
        "Describe a famous computer scientist as JSON:",
        {"json": PERSON_SCHEMA, "disable_any_whitespace": True},
    ),
    "grammar": ("Write an SQL query for the names of adult users:", {"grammar": SQL_GRAMMAR}),
}


def parse_args() -> dict:
    parser = FlexibleArgumentParser(description=__doc__.splitlines()[0])
    EngineArgs.add_cli_args(parser)
    parser.set_defaults(max_model_len=512)
    parser.add_argument("--max-tokens", type=int, default=48)
    return vars(parser.parse_args())


def main() -> None:
    args = parse_args()
    max_tokens = args.pop("max_tokens")
    llm = LLM(**args)
    prompts = [prompt for prompt, _ in CASES.values()]
    params = [
        SamplingParams(
            temperature=0.0,
            max_tokens=max_tokens,
            structured_outputs=StructuredOutputsParams(**constraint),
        )
        for _, constraint in CASES.values()
    ]
    for kind, output in zip(CASES, llm.generate(prompts, params, use_tqdm=False)):
        text = output.outputs[0].text
        print(f"{kind}: {text!r} (finish_reason={output.outputs[0].finish_reason})")
        if kind == "json" and output.outputs[0].finish_reason == "stop":
            print("parsed:", json.loads(text))


if __name__ == "__main__":
    main()
