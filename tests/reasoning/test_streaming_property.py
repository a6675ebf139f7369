"""Streaming equals non-streaming, for every reasoning parser: each fixture
output split at every token boundary, and in seeded random chunks of several
tokens, streams (reasoning, content) deltas that concatenate to exactly
`extract_reasoning`'s pair (None as ""). With the markers as single tokens
and spelled in pieces (where a marker can be cut anywhere)."""

from __future__ import annotations

import random

import pytest

from tests.reasoning.utils import TOKENIZERS, encode, make_parser, stream, text_deltas

THINK_OUTPUTS = [
    "",
    "   ",
    "plain answer, no markers",
    "thinking...</think>The answer is 42.",
    "<think>step 1\nstep 2</think>\n\nfinal",
    "\n\n<think>leading newlines</think>after",
    "<think>unicode: 猫 ✓ 🙂 é</think>réponse: 東京 🚀",
    "<think>cut off while thinking",
    "cut mid-marker </thi",
    "ends with a lone <",
    "</think>",
    "<think></think>",
    "a < b and c <= d</think>x < y",
    "text <think>late start</think>tail",
    "<think>a</think>b</think>c<think>d",
    (
        "Let me call it.\n\n<tool_call>\n<function=get_weather>\n"
        '{"city": "Zürich"}\n</function>\n</tool_call>'
    ),
    "I mention <tool_call> and go on</think>done",
    "<tool_call>\n<functio",
    "<tool_call>\n  ",
    "x<tool_call>\n</think>",
    "<think>a<tool_call>\n<function=f>\n</function>\n</tool_call></think>after",
]
MISTRAL_OUTPUTS = [
    "",
    "no markers at all",
    "[THINK]reasoning[/THINK]content",
    "Sure.[THINK]why 猫?[/THINK] 🙂 done",
    "[THINK]cut off",
    "stray end[/THINK]rest",
    "a [ b ] c [/THI",
    "[THINK]x[/THINK]y[THINK]z",
]
GRANITE_OUTPUTS = [
    "",
    "just content",
    "Here is my thought process: a\nb Here is my response: c",
    "Here's my thought process:猫 Here's my response:🙂",
    "Here is my thought process: Here is not it. Here is my response:",
    "Here is my thought process: cut off Here is my",
    "Here is my thought",
    "Here we go: not a heading",
    "Hello",
]
PARSERS = {
    "deepseek_r1": ({}, THINK_OUTPUTS),
    "qwen3": ({}, THINK_OUTPUTS),
    "qwen3_no_thinking": ({"chat_template_kwargs": {"enable_thinking": False}}, THINK_OUTPUTS),
    "mistral": ({}, MISTRAL_OUTPUTS),
    "granite": ({}, GRANITE_OUTPUTS),
}
CASES = [
    pytest.param(name, tok, i, id=f"{name}-{tok}-{i}")
    for name, (_, outputs) in PARSERS.items()
    for tok in TOKENIZERS
    for i in range(len(outputs))
]
RANDOM_SPLITS = 4


def _parser(name: str, tokenizer):
    kwargs, _ = PARSERS[name]
    return make_parser(name.removesuffix("_no_thinking"), tokenizer, **kwargs)


def _expected(parser, output: str) -> tuple[str, str]:
    reasoning, content = parser.extract_reasoning(output, request=None)
    return reasoning or "", content or ""


@pytest.mark.parametrize("name, tok, index", CASES)
def test_every_token_boundary(name, tok, index):
    tokenizer = TOKENIZERS[tok]()
    output = PARSERS[name][1][index]
    parser = _parser(name, tokenizer)
    ids = encode(tokenizer, output)
    assert tokenizer.decode(ids, skip_special_tokens=False) == output
    deltas = text_deltas(tokenizer, ids, range(1, len(ids)))
    assert stream(parser, deltas) == _expected(parser, output)
    # All at once, as one delta.
    assert stream(parser, text_deltas(tokenizer, ids, [])) == _expected(parser, output)


@pytest.mark.parametrize("name, tok, index", CASES)
def test_random_multi_token_chunks(name, tok, index):
    tokenizer = TOKENIZERS[tok]()
    output = PARSERS[name][1][index]
    parser = _parser(name, tokenizer)
    ids = encode(tokenizer, output)
    rng = random.Random(f"{name}-{tok}-{index}")
    for _ in range(RANDOM_SPLITS):
        cuts, at = [], 0
        while at < len(ids):
            at += rng.randint(1, 4)
            cuts.append(at)
        deltas = text_deltas(tokenizer, ids, [c for c in cuts if c < len(ids)])
        assert stream(parser, deltas) == _expected(parser, output), cuts


@pytest.mark.parametrize("name, tok, index", CASES)
def test_split_is_monotone(name, tok, index):
    """Each streamed part only grows: the split of a text is a prefix, part
    by part, of the split of any longer text (so no delta is ever taken back),
    and the held-back tail is released at the end."""
    tokenizer = TOKENIZERS[tok]()
    output = PARSERS[name][1][index]
    parser = _parser(name, tokenizer)
    previous = ("", "")
    for cut in range(len(output) + 1):
        reasoning, content = parser._split(output[:cut], final=False)
        current = (reasoning or "", content or "")
        for old, new in zip(previous, current):
            assert new.startswith(old), (output[:cut], previous, current)
        previous = current
    final = _expected(parser, output)
    assert all(f.startswith(p) for p, f in zip(previous, final))


def test_held_tail_is_released_at_the_end():
    """A stream cut while a marker may be starting holds that tail back until
    `extract_reasoning_streaming_final` (what the serving layer calls last)."""
    tokenizer = TOKENIZERS["plain"]()
    parser = make_parser("deepseek_r1", tokenizer)
    output = "thinking </thi"
    ids = encode(tokenizer, output)
    deltas = text_deltas(tokenizer, ids, range(1, len(ids)))
    assert stream(parser, deltas, finish=False) == ("thinking ", "")
    final = parser.extract_reasoning_streaming_final(output)
    assert final is not None and (final.reasoning, final.content) == ("</thi", None)
    assert parser.extract_reasoning_streaming_final("done</think>answer") is None
