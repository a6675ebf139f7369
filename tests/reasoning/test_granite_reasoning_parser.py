"""granite: upstream's test cases (tests/reasoning/test_granite_reasoning_parser.py
upstream), including its single-step streaming subcases."""

from __future__ import annotations

import pytest

from tests.reasoning.utils import TOKENIZERS, encode, make_parser, stream_tokens

START_REASONING = "Here is my thought process:"
START_RESPONSE = "Here is my response:"

CASES = {
    "simple": (
        f"{START_REASONING}This is a reasoning section{START_RESPONSE}This is the rest",
        "This is a reasoning section",
        "This is the rest",
    ),
    "complete": (
        f"{START_REASONING}This is a reasoning section{START_RESPONSE}",
        "This is a reasoning section",
        None,
    ),
    "no_reasoning": ("This is content", None, "This is content"),
    "multiple_lines": (
        f"{START_REASONING}This\nThat{START_RESPONSE}This is the rest\nThat",
        "This\nThat",
        "This is the rest\nThat",
    ),
    "heres_spelling": ("Here's my thought process: a Here's my response: b", " a ", " b"),
    # Upstream gives this (cut off while thinking) as content when not
    # streamed, and as reasoning when streamed; reasoning here, both ways.
    "no_response": (f"{START_REASONING} still thinking", " still thinking", None),
}

# Upstream's streaming subcases: (previous_text, current_text, reasoning, content)
# of one call (its subcase 3 passes a current_text that does not extend the
# previous one, which no stream does, and is left out).
STREAMING_SUBCASES = {
    "start_of_reasoning_sequence": ("", "Here", None, None),
    "broken_start_sequence": (
        "Here is my thought",
        "Here is my thought failure",
        None,
        "Here is my thought failure",
    ),
    "only_start_sequence": ("Here is my thought", "Here is my thought process:", None, None),
    "reasoning_started": (
        "Here is my thought process:",
        "Here is my thought process: foo",
        " foo",
        None,
    ),
    "response_sequence_started": (
        "Here is my thought process: foo",
        "Here is my thought process: foo Here is",
        " ",
        None,
    ),
    "response_sequence_reset": (
        "Here is my thought process: foo Here is",
        "Here is my thought process: foo Here is Here",
        "Here is ",
        None,
    ),
    "response_text_started": (
        "Here is my thought process: foo Here is my response:",
        "Here is my thought process: foo Here is my response: bar",
        None,
        " bar",
    ),
    "delta_has_everything": (
        "",
        "Here is my thought process: foo Here is my response: bar",
        " foo ",
        " bar",
    ),
    "delta_mixes_reasoning_and_response": (
        "Here is my thought process: foo",
        "Here is my thought process: foo bar Here is my response: baz",
        " bar ",
        " baz",
    ),
    "delta_starts_response_sequence": (
        "Here is my thought process: This is a reasoning section ",
        "Here is my thought process: This is a reasoning section Here",
        None,
        None,
    ),
    "delta_finishes_response_sequence": (
        "Here is my thought process: foo Here is my response",
        "Here is my thought process: foo Here is my response:",
        None,
        None,
    ),
    "delta_breaks_response_sequence": (
        "Here is my thought process: foo Here",
        "Here is my thought process: foo Here was",
        "Here was",
        None,
    ),
}


@pytest.fixture(scope="module")
def tokenizer():
    return TOKENIZERS["plain"]()


@pytest.mark.parametrize("case", list(CASES))
def test_extract_reasoning(tokenizer, case):
    output, reasoning, content = CASES[case]
    parser = make_parser("granite", tokenizer)
    assert parser.extract_reasoning(output, request=None) == (reasoning, content)
    assert stream_tokens(parser, tokenizer, output) == (reasoning or "", content or "")


@pytest.mark.parametrize("case", list(STREAMING_SUBCASES))
def test_streaming_subcases(tokenizer, case):
    previous, current, reasoning, content = STREAMING_SUBCASES[case]
    parser = make_parser("granite", tokenizer)
    delta = current[len(previous) :]
    message = parser.extract_reasoning_streaming(
        previous,
        current,
        delta,
        encode(tokenizer, previous),
        encode(tokenizer, current),
        encode(tokenizer, delta),
    )
    if reasoning is None and content is None:
        assert message is None
    else:
        assert message is not None
        assert (message.reasoning, message.content) == (reasoning, content)


def test_reasoning_end_and_content_ids(tokenizer):
    parser = make_parser("granite", tokenizer)
    thinking = encode(tokenizer, f"{START_REASONING} hmm")
    done = encode(tokenizer, f"{START_REASONING} hmm {START_RESPONSE} yes")
    assert not parser.is_reasoning_end(thinking)
    assert parser.is_reasoning_end(done)
    assert parser.is_reasoning_end_streaming(done, done[-1:])
    assert parser.extract_content_ids(done) == encode(tokenizer, " yes")
    assert parser.extract_content_ids(thinking) == []
