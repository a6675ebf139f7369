"""Hermes parser (`--tool-call-parser hermes`): upstream's test cases
(tests/tool_parsers/test_hermes_tool_parser.py upstream), on a small real
tokenizer with `<tool_call>`/`</tool_call>` as special tokens and on the
embedded SmolLM2 tokenizer, which lacks them (markers found by text)."""

from __future__ import annotations

import json

import pytest

from tests.tool_parsers.utils import (
    embedded_tokenizer,
    make_request,
    make_tokenizer,
    run_nonstreaming,
    run_streaming,
)
from vllm.tool_parsers import ToolParserManager
from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

PLAIN = "This is some prior text that has nothing to do with tool calling."
ONE_CALL = '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}}\n</tool_call>'
TEMPERATURE = (
    '<tool_call>{"name": "get_current_temperature",\n"arguments": {"location":\n'
    '"San Francisco, California, United States", "unit": "celsius"}}</tool_call>'
)
AFTER_PROSE = (
    "Sure, let me check the weather."
    '<tool_call>{"name": "get_weather", "arguments": {"city": "NYC"}}</tool_call>'
)
TWO_CALLS = (
    '<tool_call>{"name": "search", "arguments": {"q": "cats"}}</tool_call>\n'
    '<tool_call>{"name": "search", "arguments": {"q": "dogs"}}</tool_call>'
)
UNTIL_EOS = '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}}'
INVALID_JSON = '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}'
MALFORMED_CLOSED = 'Let me try. <tool_call>{"name": oops}</tool_call> done'
UNICODE = (
    '<tool_call>{"name": "translate", "arguments": '
    '{"text": "café 🎉 日本語", "escaped": "\\u00e9t\\u00e9", "to": "ja"}}</tool_call>'
)
SERIALIZED_ARGS = (
    '<tool_call>{"name": "get_db_config", '
    '"arguments": "{\\"param\\": \\"max_connections\\"}"}</tool_call>'
)
BARE_STRING_ARGS = '<tool_call>\n{"name": "do_thing", "arguments": "hello"}\n</tool_call>'
ANGLE_BRACKETS = "Compare a < b, write <tool> or <tool_calls>, and stop at <tool_call"
GOOD_THEN_BAD = (
    '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{bad}</tool_call>'
)
PROSE_AROUND = (
    'Checking.<tool_call>{"name": "get_weather", "arguments": '
    '{"city": "Paris", "unit": "c"}}</tool_call> Done!'
)
NON_FINITE = '<tool_call>{"name": "f", "arguments": {"x": NaN, "y": 1e999}}</tool_call>'
ESCAPES = (
    '<tool_call>{"name": "write", "arguments": {"path": "C:\\\\tmp\\\\a.txt", '
    '"text": "He said \\"hi\\" {not json} </tool_call>"}}</tool_call>'
)

HERMES_OUTPUTS = [
    PLAIN,
    ONE_CALL,
    TEMPERATURE,
    AFTER_PROSE,
    TWO_CALLS,
    UNTIL_EOS,
    INVALID_JSON,
    MALFORMED_CLOSED,
    UNICODE,
    SERIALIZED_ARGS,
    BARE_STRING_ARGS,
    ANGLE_BRACKETS,
    GOOD_THEN_BAD,
    PROSE_AROUND,
    NON_FINITE,
    "",
]


def hermes_tokenizer():
    """A Hermes/Qwen-like tokenizer: the markers are special tokens."""
    return make_tokenizer(["<tool_call>", "</tool_call>"], HERMES_OUTPUTS)


TOKENIZERS = {"special-tokens": hermes_tokenizer, "smollm2-text": embedded_tokenizer}


@pytest.fixture(params=list(TOKENIZERS))
def tokenizer(request):
    return TOKENIZERS[request.param]()


def parse(text: str):
    return run_nonstreaming(Hermes2ProToolParser(hermes_tokenizer()), text)


def test_registered_under_upstream_name():
    assert ToolParserManager.get_tool_parser("hermes") is Hermes2ProToolParser


def test_markers_are_single_tokens_only_in_the_family_tokenizer():
    ids = hermes_tokenizer().encode("<tool_call>", add_special_tokens=False)
    assert len(ids) == 1
    assert len(embedded_tokenizer().encode("<tool_call>", add_special_tokens=False)) > 1


@pytest.mark.parametrize(
    "text", [PLAIN, ANGLE_BRACKETS, MALFORMED_CLOSED, INVALID_JSON, NON_FINITE]
)
def test_no_call_is_the_whole_output_as_content(text):
    assert parse(text) == (text, [], False)


def test_one_call_between_tags():
    assert parse(ONE_CALL) == (None, [("final_answer", '{"trigger": true}')], True)


def test_one_call_until_eos():
    assert parse(UNTIL_EOS) == (None, [("final_answer", '{"trigger": true}')], True)


def test_call_after_prose_keeps_the_prose_as_content():
    assert parse(AFTER_PROSE) == (
        "Sure, let me check the weather.",
        [("get_weather", '{"city": "NYC"}')],
        True,
    )
    # upstream: only the text before the first call is content
    content, calls, _ = parse(PROSE_AROUND)
    assert content == "Checking." and len(calls) == 1


def test_several_calls():
    content, calls, _ = parse(TWO_CALLS)
    assert content is None
    assert calls == [("search", '{"q": "cats"}'), ("search", '{"q": "dogs"}')]


def test_unicode_arguments_are_not_ascii_escaped():
    _, calls, _ = parse(UNICODE)
    # json.dumps(..., ensure_ascii=False), as upstream
    assert calls == [("translate", '{"text": "café 🎉 日本語", "escaped": "été", "to": "ja"}')]


def test_serialized_arguments_are_not_encoded_twice():
    _, calls, _ = parse(SERIALIZED_ARGS)
    assert json.loads(calls[0][1]) == {"param": "max_connections"}
    _, calls, _ = parse(BARE_STRING_ARGS)
    assert json.loads(calls[0][1]) == "hello"


def test_closing_tag_inside_a_string_ends_the_block_as_upstream():
    # upstream's regex stops at the first </tool_call>: the JSON is cut, so content
    assert parse(ESCAPES) == (ESCAPES, [], False)


def test_malformed_block_after_a_good_call_comes_back_as_content():
    assert parse(GOOD_THEN_BAD) == ("<tool_call>{bad}</tool_call>", [("a", "{}")], True)


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 8])
def test_streaming_matches_upstream_expectations(tokenizer, chunk):
    parser = Hermes2ProToolParser(tokenizer)
    got = run_streaming(parser, tokenizer, AFTER_PROSE, [chunk])
    assert got.content == "Sure, let me check the weather."
    assert got.call_tuples() == [("get_weather", '{"city": "NYC"}')]
    # upstream's state attributes, which serving code reads
    assert parser.prev_tool_call_arr == [{"name": "get_weather", "arguments": {"city": "NYC"}}]
    assert parser.streamed_args_for_tool == ['{"city": "NYC"}']


def test_streaming_plain_text_is_forwarded_as_it_comes(tokenizer):
    got = run_streaming(Hermes2ProToolParser(tokenizer), tokenizer, PLAIN)
    assert got.content == PLAIN and not got.calls
    # nothing is held back: every token's text goes out in its own step
    assert len(got.deltas) == len(tokenizer.encode(PLAIN, add_special_tokens=False))


def test_streaming_holds_a_possible_marker_until_it_is_decided(tokenizer):
    parser = Hermes2ProToolParser(tokenizer)
    got = run_streaming(parser, tokenizer, ANGLE_BRACKETS)
    assert got.content == ANGLE_BRACKETS and not got.calls
    # the trailing "<tool_call" (a marker prefix) only goes out at the finish
    assert got.deltas[-1].content.endswith("<tool_call")


def test_streaming_truncated_call_comes_back_as_content(tokenizer):
    got = run_streaming(Hermes2ProToolParser(tokenizer), tokenizer, INVALID_JSON)
    assert got.content == INVALID_JSON and not got.calls


def test_adjust_request_keeps_special_tokens_when_tools_are_offered():
    parser = Hermes2ProToolParser(hermes_tokenizer())
    assert parser.adjust_request(make_request()).skip_special_tokens is False
    req = make_request(tool_choice="none")
    assert parser.adjust_request(req).skip_special_tokens is True
