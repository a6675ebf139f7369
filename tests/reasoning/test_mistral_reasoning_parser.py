"""mistral: `[THINK]...[/THINK]` as upstream v0.28's parser splits it (no
`[THINK]`: all content), with the markers as special tokens and in pieces."""

from __future__ import annotations

import pytest

from tests.reasoning.utils import TOKENIZERS, encode, make_parser, stream_tokens

CASES = {
    "end_without_start": (
        "This is a reasoning section[/THINK]This is the rest",
        None,
        "This is a reasoning sectionThis is the rest",
        False,
    ),
    "no_markers": ("This is content", None, "This is content", False),
    "with_think": (
        "[THINK]This is a reasoning section[/THINK]This is the rest",
        "This is a reasoning section",
        "This is the rest",
        True,
    ),
    "complete_with_think": (
        "[THINK]This is a reasoning section[/THINK]",
        "This is a reasoning section",
        None,
        True,
    ),
    "multiple_lines_with_think": (
        "[THINK]This\nThat[/THINK]This is the rest\nThat",
        "This\nThat",
        "This is the rest\nThat",
        True,
    ),
    "think_no_end": (
        "[THINK]This is a reasoning section",
        "This is a reasoning section",
        None,
        False,
    ),
    "empty": ("", None, "", False),
    "new_line": (
        "\n[THINK]This is a reasoning section[/THINK]\nThis is the rest",
        "This is a reasoning section",
        "\n\nThis is the rest",
        True,
    ),
    "content_before_think": ("Sure.[THINK]hmm", "hmm", "Sure.", False),
}


@pytest.fixture(params=list(TOKENIZERS), scope="module")
def tokenizer(request):
    return TOKENIZERS[request.param]()


@pytest.mark.parametrize("case", list(CASES))
def test_extract_reasoning(tokenizer, case):
    output, reasoning, content, _ = CASES[case]
    parser = make_parser("mistral", tokenizer)
    assert parser.extract_reasoning(output, request=None) == (reasoning, content)
    assert stream_tokens(parser, tokenizer, output) == (reasoning or "", content or "")


@pytest.mark.parametrize("case", list(CASES))
def test_is_reasoning_end(tokenizer, case):
    output, _, _, ended = CASES[case]
    parser = make_parser("mistral", tokenizer)
    assert parser.is_reasoning_end(encode(tokenizer, output)) is ended


def test_content_ids_with_marker_tokens():
    tokenizer = TOKENIZERS["markers"]()
    parser = make_parser("mistral", tokenizer)
    ids = encode(tokenizer, "Sure.[THINK]hmm[/THINK] Done")
    assert parser.extract_content_ids(ids) == encode(tokenizer, "Sure.") + encode(
        tokenizer, " Done"
    )
    plain = encode(tokenizer, "no markers")
    assert parser.extract_content_ids(plain) == plain


def test_end_after_long_reasoning_is_seen_while_streaming(tokenizer):
    """The start marker far behind the newest tokens still counts."""
    parser = make_parser("mistral", tokenizer)
    ids = encode(tokenizer, "[THINK]" + "long thought " * 40)
    assert not parser.is_reasoning_end_streaming(ids, ids[-1:])
    end = encode(tokenizer, "[/THINK]")
    seen = [
        parser.is_reasoning_end_streaming(ids + end[: i + 1], end[i : i + 1])
        for i in range(len(end))
    ]
    assert seen[-1] and not any(seen[:-1])
    # An end marker without a start marker does not end any reasoning.
    stray = encode(tokenizer, "no thinking here") + end
    assert not parser.is_reasoning_end_streaming(stray, end[-1:])
