"""qwen3: upstream's test cases (tests/reasoning/test_qwen3_reasoning_parser.py
upstream), with the markers as tokens and spelled in pieces."""

from __future__ import annotations

import pytest

from tests.reasoning.utils import TOKENIZERS, encode, make_parser, stream, stream_tokens

TOOL_CALL_BODY = (
    "<tool_call>\n<function=bash>\n<parameter=command>"
    "\ncat /etc/hosts\n</parameter>\n</function>\n</tool_call>"
)
# (output, reasoning, content) as upstream's cases, thinking on (the default).
CASES = {
    "without_start_token": (
        "This is a reasoning section</think>This is the rest",
        "This is a reasoning section",
        "This is the rest",
    ),
    "without_start_token_complete": (
        "This is a reasoning section</think>",
        "This is a reasoning section",
        None,
    ),
    "with_think": (
        "<think>This is a reasoning section</think>This is the rest",
        "This is a reasoning section",
        "This is the rest",
    ),
    "without_think_truncated": ("This is the rest", "This is the rest", None),
    "complete_reasoning": (
        "<think>This is a reasoning section</think>",
        "This is a reasoning section",
        None,
    ),
    "multiline": (
        "<think>This is a reasoning\nsection</think>This is the rest\nThat",
        "This is a reasoning\nsection",
        "This is the rest\nThat",
    ),
    "only_open_tag": ("<think>This is a reasoning section", "This is a reasoning section", None),
    "tool_call_no_think_end": (
        "I need to read the file.\n\n" + TOOL_CALL_BODY,
        "I need to read the file.\n\n",
        TOOL_CALL_BODY,
    ),
    "tool_call_with_think_no_end": (
        "<think>I need to read the file.\n\n" + TOOL_CALL_BODY,
        "I need to read the file.\n\n",
        TOOL_CALL_BODY,
    ),
    # A <tool_call> mentioned in the reasoning, not opening a function, does not end it.
    "tool_call_mentioned": ("use <tool_call> tags", "use <tool_call> tags", None),
}

# Upstream's multi-token deltas: (deltas, reasoning, content).
MULTI_TOKEN_DELTAS = {
    "start_token_grouped_with_text": (
        ["<think>This is a reasoning section", "</think>", "This is the rest"],
        "This is a reasoning section",
        "This is the rest",
    ),
    "end_token_grouped_with_content": (
        ["reasoning section", "</think>This is the rest"],
        "reasoning section",
        "This is the rest",
    ),
    "start_and_end_in_one_delta": (["<think>reasoning</think>"], "reasoning", ""),
    "tool_call_implicit_reasoning_end": (
        ["I need to read the file.\n\n", "<tool_call>\n<function=bash>"],
        "I need to read the file.\n\n",
        "<tool_call>\n<function=bash>",
    ),
}

THINKING_DISABLED = [
    "This is plain content",
    "Some output without think tokens",
    "I need to read the file.\n\n" + TOOL_CALL_BODY,
]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(params=list(TOKENIZERS), scope="module")
def tokenizer(request):
    return TOKENIZERS[request.param]()


@pytest.mark.parametrize("case", list(CASES))
def test_extract_reasoning(tokenizer, case):
    output, reasoning, content = CASES[case]
    parser = make_parser("qwen3", tokenizer)
    assert parser.extract_reasoning(output, request=None) == (reasoning, content)
    assert stream_tokens(parser, tokenizer, output) == (reasoning or "", content or "")


@pytest.mark.parametrize("case", list(MULTI_TOKEN_DELTAS))
def test_multi_token_deltas(tokenizer, case):
    chunks, reasoning, content = MULTI_TOKEN_DELTAS[case]
    parser = make_parser("qwen3", tokenizer)
    deltas = [(chunk, encode(tokenizer, chunk)) for chunk in chunks]
    assert stream(parser, deltas) == (reasoning, content)


@pytest.mark.parametrize("output", THINKING_DISABLED)
def test_thinking_disabled_is_all_content(tokenizer, output):
    parser = make_parser("qwen3", tokenizer, **NO_THINKING)
    assert parser.extract_reasoning(output, request=None) == (None, output)
    assert stream_tokens(parser, tokenizer, output) == ("", output)
    ids = encode(tokenizer, output)
    assert parser.extract_content_ids(ids) == ids


def test_thinking_disabled_ends_reasoning_from_the_first_token(tokenizer):
    """What the structured-output manager asks: with enable_thinking false
    a grammar applies from the first token, whatever the prompt holds."""
    prompt = encode(tokenizer, "<|im_start|>assistant\n<think>\n")
    assert not make_parser("qwen3", tokenizer).is_reasoning_end(prompt)
    assert make_parser("qwen3", tokenizer, **NO_THINKING).is_reasoning_end(prompt)
    assert make_parser("qwen3", tokenizer, **NO_THINKING).is_reasoning_end([])
    enabled = make_parser("qwen3", tokenizer, chat_template_kwargs={"enable_thinking": True})
    assert not enabled.is_reasoning_end(prompt)


def test_tool_call_ends_reasoning_for_the_grammar(tokenizer):
    parser = make_parser("qwen3", tokenizer)
    before = encode(tokenizer, "I need to read the file.\n\n<tool_call>\n")
    after = encode(tokenizer, "I need to read the file.\n\n<tool_call>\n<function=bash>")
    assert not parser.is_reasoning_end(before)
    assert parser.is_reasoning_end(after)
    assert parser.is_reasoning_end_streaming(after, after[-1:])
    assert not parser.is_reasoning_end(encode(tokenizer, "use <tool_call> tags"))


def test_tool_calls_in_the_chat_history_do_not_end_reasoning(tokenizer):
    """A prompt whose history holds a complete tool call, and whose generation
    prompt has no `<think>` (the model writes it): not ended."""
    parser = make_parser("qwen3", tokenizer)
    prompt = (
        "<|im_start|>assistant\n" + TOOL_CALL_BODY + "<|im_end|>\n"
        "<|im_start|>user\nthanks<|im_end|>\n<|im_start|>assistant\n"
    )
    assert not parser.is_reasoning_end(encode(tokenizer, prompt))
