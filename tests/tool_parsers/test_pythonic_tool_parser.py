"""Pythonic parser (`--tool-call-parser pythonic`): upstream's test cases
(tests/tool_parsers/test_pythonic_tool_parser.py upstream) on small real
tokenizers (a byte-level BPE trained here, and SmolLM2's)."""

from __future__ import annotations

import json

import pytest

from tests.tool_parsers.utils import (
    embedded_tokenizer,
    make_tokenizer,
    run_nonstreaming,
    run_streaming,
)
from vllm.tool_parsers import ToolParserManager
from vllm.tool_parsers.pythonic_tool_parser import PythonicToolParser

SIMPLE = "get_weather(city='San Francisco', metric='celsius')"
SIMPLE_CALL = ("get_weather", '{"city": "San Francisco", "metric": "celsius"}')
MORE_TYPES = (
    "register_user(name='John Doe', age=37, address={'city': 'San Francisco', 'state': 'CA'}, "
    "role=None, passed_test=True, aliases=['John', 'Johnny'])"
)
MORE_TYPES_CALL = (
    "register_user",
    (
        '{"name": "John Doe", "age": 37, "address": {"city": "San Francisco", "state": "CA"}, '
        '"role": null, "passed_test": true, "aliases": ["John", "Johnny"]}'
    ),
)
PARAMETERLESS = ("get_weather()", ("get_weather", "{}"))
EMPTY_DICT = (
    "do_something_cool(additional_data={})",
    ("do_something_cool", '{"additional_data": {}}'),
)
EMPTY_LIST = ("do_something_cool(steps=[])", ("do_something_cool", '{"steps": []}'))
ESCAPED = (
    r"get_weather(city='Martha\'s Vineyard', metric='\"cool units\"')",
    ("get_weather", '{"city": "Martha\'s Vineyard", "metric": "\\"cool units\\""}'),
)
UNICODE = (
    "translate(text='café 🎉 日本語', n=-2, t=(1, 2.5))",
    ("translate", '{"text": "café 🎉 日本語", "n": -2, "t": [1, 2.5]}'),
)

ONE_CALL_CASES = [
    (f"[{SIMPLE}]", [SIMPLE_CALL]),
    (f"[{MORE_TYPES}]", [MORE_TYPES_CALL]),
    *[
        (f"[{src}]", [call])
        for src, call in (PARAMETERLESS, EMPTY_DICT, EMPTY_LIST, ESCAPED, UNICODE)
    ],
    (f"[{SIMPLE}, {MORE_TYPES}]", [SIMPLE_CALL, MORE_TYPES_CALL]),
    (f"  [{SIMPLE},\n {PARAMETERLESS[0]}]", [SIMPLE_CALL, PARAMETERLESS[1]]),
]
NO_CALL = [
    "How can I help you today?",
    "[Note] a bracket that is not a call list",
    "[1, 2, 3]",
    "[]",
    "[foo(x=1])]",  # mismatched brackets
    f"[{SIMPLE}",  # never closed
    "[f(a=b)]",  # not a literal
    "[f(1, 2)]",  # positional arguments
    "[bad(x=b'z'), calc(x=1e999)]",  # no JSON for bytes or inf
    "",
]
BAD_SIBLING = f"[bad(x=b'z'), {SIMPLE}, calc(x=1e999)]"
TRAILING = f"[{SIMPLE}] Anything else?"
STRING_BRACKETS = '[note(text=\'a ] and ( in a string, "quoted"\', more="it\'s")]'

PYTHONIC_OUTPUTS = [
    *[text for text, _ in ONE_CALL_CASES],
    *NO_CALL,
    BAD_SIBLING,
    TRAILING,
    STRING_BRACKETS,
]


def pythonic_tokenizer():
    return make_tokenizer([], PYTHONIC_OUTPUTS)


def parse(text: str):
    return run_nonstreaming(PythonicToolParser(pythonic_tokenizer()), text)


def test_registered_under_upstream_name():
    assert ToolParserManager.get_tool_parser("pythonic") is PythonicToolParser


@pytest.mark.parametrize("text, calls", ONE_CALL_CASES)
@pytest.mark.parametrize("streaming", [False, True])
def test_calls(text, calls, streaming):
    if streaming:
        tok = embedded_tokenizer()
        got = run_streaming(PythonicToolParser(tok), tok, text)
        assert (got.content, got.call_tuples()) == ("", calls)
    else:
        assert parse(text) == (None, calls, True)


@pytest.mark.parametrize("text", NO_CALL)
def test_no_call_is_the_whole_output_as_content(text):
    assert parse(text) == (text, [], False)


def test_bad_sibling_does_not_drop_good_calls():
    assert parse(BAD_SIBLING) == (None, [SIMPLE_CALL], True)


def test_text_after_the_list_is_content():
    assert parse(TRAILING) == (" Anything else?", [SIMPLE_CALL], True)


def test_brackets_and_quotes_inside_strings():
    _, calls, _ = parse(STRING_BRACKETS)
    assert json.loads(calls[0][1]) == {"text": 'a ] and ( in a string, "quoted"', "more": "it's"}


def test_streaming_in_large_steps():
    tok = pythonic_tokenizer()
    text = f"[{SIMPLE}, {PARAMETERLESS[0]}, {EMPTY_LIST[0]}]"
    got = run_streaming(PythonicToolParser(tok), tok, text, [5])
    assert got.call_tuples() == [SIMPLE_CALL, PARAMETERLESS[1], EMPTY_LIST[1]]
    assert got.content == ""


def test_streaming_prose_is_not_held_back():
    tok = pythonic_tokenizer()
    text = "How can I help you today?"
    got = run_streaming(PythonicToolParser(tok), tok, text)
    assert got.content == text
    assert len(got.deltas) == len(tok.encode(text, add_special_tokens=False))
