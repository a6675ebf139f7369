"""Offline chat with `LLM.chat`: a conversation rendered with the model's chat template.

    python examples/offline_inference/chat.py [--model PATH] [--chat-template FILE]

Two things are shown: one conversation (system prompt, a turn of history, a
question) and a batch of conversations in one call. The model's own chat
template is used unless `--chat-template` names a Jinja file (needed for a
model whose tokenizer has none).
"""

from pathlib import Path

from vllm import LLM, EngineArgs, SamplingParams
from vllm.utils.argparse_utils import FlexibleArgumentParser

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hello! How can I assist you today?"},
    {"role": "user", "content": "Write an essay about the importance of higher education."},
]


def parse_args() -> dict:
    parser = FlexibleArgumentParser(description=__doc__.splitlines()[0])
    EngineArgs.add_cli_args(parser)
    parser.set_defaults(max_model_len=1024)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--chat-template", default=None, help="a Jinja chat template file")
    return vars(parser.parse_args())


def main() -> None:
    args = parse_args()
    params = SamplingParams(temperature=0.0, max_tokens=args.pop("max_tokens"))
    template_path = args.pop("chat_template")
    template = Path(template_path).read_text() if template_path else None
    llm = LLM(**args)

    (output,) = llm.chat(CONVERSATION, params, use_tqdm=False, chat_template=template)
    print(f"Prompt: {output.prompt!r}")
    print(f"Answer: {output.outputs[0].text!r}")

    batch = [[{"role": "user", "content": q}] for q in ("What is 2 + 2?", "Name a colour.")]
    for out in llm.chat(batch, params, use_tqdm=False, chat_template=template):
        print(f"Batch answer: {out.outputs[0].text!r}")


if __name__ == "__main__":
    main()
