"""deepseek_r1: upstream's test cases (tests/reasoning/test_deepseekr1_reasoning_parser.py
upstream), with the markers as tokens and spelled in pieces."""

from __future__ import annotations

import pytest

from tests.reasoning.utils import TOKENIZERS, encode, make_parser, stream_tokens

# (output, reasoning, content, is_reasoning_end) as upstream's non-streamed cases.
CASES = {
    "simple": (
        "This is a reasoning section</think>This is the rest",
        "This is a reasoning section",
        "This is the rest",
        True,
    ),
    "complete": ("This is a reasoning section</think>", "This is a reasoning section", None, True),
    "no_content": ("This is content", "This is content", None, False),
    "multiple_lines": (
        "This\nThat</think>This is the rest\nThat",
        "This\nThat",
        "This is the rest\nThat",
        True,
    ),
    "shortest": ("</think>This is the rest", "", "This is the rest", True),
    "with_think": (
        "<think>This is a reasoning section</think>This is the rest",
        "This is a reasoning section",
        "This is the rest",
        True,
    ),
    "complete_with_think": (
        "<think>This is a reasoning section</think>",
        "This is a reasoning section",
        None,
        True,
    ),
    "multiple_lines_with_think": (
        "<think>This\nThat</think>This is the rest\nThat",
        "This\nThat",
        "This is the rest\nThat",
        True,
    ),
    "think_no_end": (
        "<think>This is a reasoning section",
        "This is a reasoning section",
        None,
        False,
    ),
    "empty": ("", "", None, False),
    "new_line": (
        "\n<think>This is a reasoning section</think>\nThis is the rest",
        "This is a reasoning section",
        "\nThis is the rest",
        True,
    ),
}


@pytest.fixture(params=list(TOKENIZERS), scope="module")
def tokenizer(request):
    return TOKENIZERS[request.param]()


@pytest.mark.parametrize("case", list(CASES))
def test_extract_reasoning(tokenizer, case):
    output, reasoning, content, _ = CASES[case]
    parser = make_parser("deepseek_r1", tokenizer)
    assert parser.extract_reasoning(output, request=None) == (reasoning, content)


@pytest.mark.parametrize("case", list(CASES))
def test_streamed_equals_extracted(tokenizer, case):
    """Upstream streams "new_line" as reasoning "\\nThis is..." (text before
    `<think>` is sent before the marker shows up); here leading whitespace is
    held until it is known, so the stream equals the non-streamed split."""
    output, reasoning, content, _ = CASES[case]
    parser = make_parser("deepseek_r1", tokenizer)
    assert stream_tokens(parser, tokenizer, output) == (reasoning or "", content or "")


@pytest.mark.parametrize("case", list(CASES))
def test_is_reasoning_end_and_content_ids(tokenizer, case):
    output, _, content, ended = CASES[case]
    parser = make_parser("deepseek_r1", tokenizer)
    ids = encode(tokenizer, output)
    assert parser.is_reasoning_end(ids) is ended
    assert parser.extract_content_ids(ids) == (encode(tokenizer, content) if content else [])


def test_marker_ids_come_from_the_vocabulary():
    with_markers = make_parser("deepseek_r1", TOKENIZERS["markers"]())
    vocab = TOKENIZERS["markers"]().get_vocab()
    assert (with_markers.start_token_id, with_markers.end_token_id) == (
        vocab["<think>"],
        vocab["</think>"],
    )
    plain = make_parser("deepseek_r1", TOKENIZERS["plain"]())
    assert (plain.start_token_id, plain.end_token_id) == (None, None)


def test_is_reasoning_end_takes_the_last_marker(tokenizer):
    """A prompt whose history closed a think block but whose generation
    prompt opens a new one: the reasoning has not ended."""
    parser = make_parser("deepseek_r1", tokenizer)
    assert not parser.is_reasoning_end(encode(tokenizer, "<think>a</think>b<think>\n"))
    assert parser.is_reasoning_end(encode(tokenizer, "<think>a</think>b"))
    ids = encode(tokenizer, "<think>abc</think>x")
    end = next(i for i in range(len(ids)) if "</think>" in tokenizer.decode(ids[: i + 1]))
    assert not parser.is_reasoning_end_streaming(ids[:end], ids[end - 1 : end])
    assert parser.is_reasoning_end_streaming(ids[: end + 1], ids[end : end + 1])
