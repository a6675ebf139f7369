"""LLM.chat: rendering with a chat template and its options
(upstream: tests/entrypoints/llm/test_chat.py)."""

from __future__ import annotations

import pytest

from tests.entrypoints.utils import make_inproc_llm
from vllm import SamplingParams
from vllm.entrypoints.chat_utils import apply_hf_chat_template

# A ChatML-like template that reads a custom variable, as thinking models do.
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
    "{% if not (loop.last and continue_final_message) %}<|end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking %}<think>{% endif %}{% endif %}"
)
# A template that walks OpenAI-style content parts.
PARTS_TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}]"
    "{% for part in m['content'] %}({{ part['text'] }}){% endfor %}{% endfor %}"
)
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Name a fox."},
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return make_inproc_llm(tiny_model_dir("llama"), max_model_len=128)


def test_chat_renders_the_template_and_generates(llm):
    tokenizer = llm.get_tokenizer()
    (out,) = llm.chat(CONVERSATION, GREEDY, chat_template=TEMPLATE, use_tqdm=False)
    text = "<|system|>Be brief.<|end|><|user|>Name a fox.<|end|><|assistant|>"
    assert out.prompt == text
    assert out.prompt_token_ids == tokenizer.encode(text, add_special_tokens=False)
    (plain,) = llm.generate({"prompt_token_ids": out.prompt_token_ids}, GREEDY, use_tqdm=False)
    assert out.outputs[0].token_ids == plain.outputs[0].token_ids


def test_generation_prompt_continuation_and_kwargs(llm):
    def render(conv, **kw):
        return llm.chat(conv, GREEDY, chat_template=TEMPLATE, use_tqdm=False, **kw)[0].prompt

    assert render(CONVERSATION, add_generation_prompt=False).endswith("fox.<|end|>")
    partial = CONVERSATION + [{"role": "assistant", "content": "Reyn"}]
    assert render(partial, add_generation_prompt=False, continue_final_message=True).endswith(
        "<|assistant|>Reyn"
    )
    thinking = render(
        CONVERSATION, chat_template_kwargs={"enable_thinking": True, "unused_by_template": 1}
    )
    assert thinking.endswith("<|assistant|><think>")


def test_several_conversations_and_content_parts(llm):
    parts = [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "Name a fox."}]},
    ]
    outs = llm.chat(
        [CONVERSATION, parts, CONVERSATION[1:]], GREEDY, chat_template=TEMPLATE, use_tqdm=False
    )
    assert len(outs) == 3
    # String-content templates get the text parts joined.
    assert outs[0].prompt == outs[1].prompt != outs[2].prompt
    tokenizer = llm.get_tokenizer()
    assert (
        apply_hf_chat_template(
            tokenizer, CONVERSATION, PARTS_TEMPLATE, None, add_generation_prompt=False
        )
        == "[system](Be brief.)[user](Name a fox.)"
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(add_generation_prompt=True, continue_final_message=True, chat_template=TEMPLATE),
            "continue_final_message",
        ),
        (dict(chat_template_kwargs={"tokenize": True}, chat_template=TEMPLATE), "tokenize"),
        (dict(chat_template="{% if %}"), "[Ee]xpected"),  # a template syntax error
        (dict(), "chat template"),  # the tiny tokenizer has none
    ],
)
def test_bad_chat_requests_are_value_errors(llm, kwargs, message):
    with pytest.raises(ValueError, match=message):
        llm.chat(CONVERSATION, GREEDY, use_tqdm=False, **kwargs)
    assert llm.llm_engine.get_num_unfinished_requests() == 0
    (out,) = llm.chat(CONVERSATION, GREEDY, chat_template=TEMPLATE, use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 4
