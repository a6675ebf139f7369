"""BaseThinkingReasoningParser with a subclass's own markers: upstream's
cases (tests/reasoning/test_base_thinking_reasoning_parser.py upstream).

One deliberate difference: upstream refuses a tokenizer without the markers
as tokens (RuntimeError); here such a tokenizer works, markers found in text."""

from __future__ import annotations

import tempfile

import pytest

from tests.reasoning.utils import encode, stream, stream_tokens
from tests.utils import make_tiny_tokenizer
from vllm.reasoning.basic_parsers import BaseThinkingReasoningParser


class ThinkParser(BaseThinkingReasoningParser):
    @property
    def start_token(self) -> str:
        return "<test:think>"

    @property
    def end_token(self) -> str:
        return "</test:think>"


class AltParser(BaseThinkingReasoningParser):
    @property
    def start_token(self) -> str:
        return "<alt:start>"

    @property
    def end_token(self) -> str:
        return "<alt:end>"


@pytest.fixture(scope="module")
def tokenizer():
    tok = make_tiny_tokenizer(tempfile.mkdtemp(prefix="base-think-"))
    tok.add_tokens(["<test:think>", "</test:think>", "<alt:start>", "<alt:end>"])
    return tok


@pytest.fixture(scope="module")
def parser(tokenizer):
    return ThinkParser(tokenizer)


def test_init(tokenizer, parser):
    assert (parser.start_token, parser.end_token) == ("<test:think>", "</test:think>")
    assert parser.start_token_id == tokenizer.get_vocab()["<test:think>"]
    assert parser.end_token_id == tokenizer.get_vocab()["</test:think>"]
    with pytest.raises(ValueError, match="model tokenizer must be passed"):
        ThinkParser(None)

    class Empty(BaseThinkingReasoningParser):
        start_token = ""
        end_token = ""

    with pytest.raises(ValueError, match="start_token and end_token must be defined"):
        Empty(tokenizer)


def test_markers_missing_from_the_vocabulary_are_found_in_text(tokenizer):
    class Missing(BaseThinkingReasoningParser):
        start_token = "<missing:start>"
        end_token = "<missing:end>"

    parser = Missing(tokenizer)
    assert (parser.start_token_id, parser.end_token_id) == (None, None)
    output = "<missing:start>why<missing:end>because"
    assert parser.extract_reasoning(output, request=None) == ("why", "because")
    assert parser.is_reasoning_end(encode(tokenizer, output))
    assert stream_tokens(parser, tokenizer, output) == ("why", "because")


def test_is_reasoning_end(parser):
    s, e = parser.start_token_id, parser.end_token_id
    assert parser.is_reasoning_end([1, 2, e, 4]) is True
    assert parser.is_reasoning_end([1, 2, 3, 4]) is False
    assert parser.is_reasoning_end([]) is False
    assert parser.is_reasoning_end([1, s, 2, e]) is True
    assert parser.is_reasoning_end([1, s, 2, 3]) is False
    assert parser.is_reasoning_end([1, s, 2, e, 2, 2, s]) is False


def test_is_reasoning_end_streaming(parser):
    s, e = parser.start_token_id, parser.end_token_id
    assert parser.is_reasoning_end_streaming([1, 2, e], [e]) is True
    assert parser.is_reasoning_end_streaming([1, 2, 3, 4], [4]) is False
    assert parser.is_reasoning_end_streaming([], []) is False
    assert parser.is_reasoning_end_streaming([1, s, 2, e], [e]) is True
    assert parser.is_reasoning_end_streaming([1, s, 2, 3], [3]) is False
    assert parser.is_reasoning_end_streaming([1, s, 2, e, 2, s, 2], [2]) is False
    assert parser.is_reasoning_end_streaming([1, s, 2, e, 2, 2], [2]) is False


def test_extract_content_ids(parser):
    e = parser.end_token_id
    assert parser.extract_content_ids([1, 2, e, 4, 5]) == [4, 5]
    assert parser.extract_content_ids([1, 2, 3, e]) == []
    assert parser.extract_content_ids([1, 2, 3, 4]) == []


@pytest.mark.parametrize(
    "output, reasoning, content",
    [
        (
            "<test:think>This is reasoning</test:think>This is content",
            "This is reasoning",
            "This is content",
        ),
        ("This is reasoning</test:think>This is content", "This is reasoning", "This is content"),
        ("This is just content", "This is just content", None),
        ("", "", None),
        ("<test:think></test:think>", "", None),
        ("First</test:think>Middle</test:think>Last", "First", "Middle</test:think>Last"),
        (
            "<test:think>Outer<test:think>Inner</test:think>Content",
            "Outer<test:think>Inner",
            "Content",
        ),
        (
            "<test:thinking>Not a real token</test:thinking>Content",
            "<test:thinking>Not a real token</test:thinking>Content",
            None,
        ),
    ],
)
def test_extract_reasoning(tokenizer, parser, output, reasoning, content):
    assert parser.extract_reasoning(output, request=None) == (reasoning, content)
    assert stream_tokens(parser, tokenizer, output) == (reasoning, content or "")


@pytest.mark.parametrize(
    "deltas, reasoning, content",
    [
        (
            ["<test:think>", "Some ", "reasoning ", "content", "</test:think>", "Final ", "answer"],
            "Some reasoning content",
            "Final answer",
        ),
        (
            ["<test:think>", "Some ", "reasoning ", "without ", "end"],
            "Some reasoning without end",
            "",
        ),
        (["<test:think>Some reasoning", "</test:think>", "Answer"], "Some reasoning", "Answer"),
        (["<test:think>Some reasoning"], "Some reasoning", ""),
    ],
)
def test_streaming_deltas(tokenizer, parser, deltas, reasoning, content):
    assert stream(parser, [(d, encode(tokenizer, d)) for d in deltas]) == (reasoning, content)


def test_two_implementations_keep_their_own_markers(tokenizer):
    first, second = ThinkParser(tokenizer), AltParser(tokenizer)
    assert first.extract_reasoning("R1</test:think>C1", None) == ("R1", "C1")
    assert second.extract_reasoning("R2<alt:end>C2", None) == ("R2", "C2")
    assert second.extract_reasoning("R1</test:think>C1", None) == ("R1</test:think>C1", None)
    assert first.end_token_id != second.end_token_id
