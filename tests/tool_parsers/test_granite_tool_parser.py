"""Granite parser (`--tool-call-parser granite`): upstream's test cases
(tests/tool_parsers/test_granite_tool_parser.py upstream) on a small real
tokenizer with Granite 3.0's `<|tool_call|>` special token (Granite 3.1's
`<tool_call>` is plain text) and on SmolLM2's."""

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
from vllm.tool_parsers.granite_tool_parser import GraniteToolParser

PLAIN = "This is a regular response without any tool calls."
SINGLE = '<|tool_call|> [{"name": "get_weather", "arguments": {"city": "Tokyo"}}]'
PARALLEL = """<|tool_call|> [
  {"name": "get_weather", "arguments": {"city": "Tokyo"}},
  {"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}
]"""
DATA_TYPES = """<tool_call> [{
  "name": "test_function",
  "arguments": {
    "string_field": "hello", "int_field": 42, "float_field": 3.14, "bool_field": true,
    "null_field": null, "array_field": ["a", "b", "c"], "object_field": {"nested": "value"},
    "empty_array": [], "empty_object": {}
  }
}]"""
EMPTY_ARGS = '<|tool_call|> [{"name": "refresh", "arguments": {}}]'
SURROUNDED = """Let me check the weather for you.
<|tool_call|> [{"name": "get_weather", "arguments": {"city": "Tokyo"}}]
I'll get that information."""
ESCAPES = """<tool_call> [{
  "name": "test_function",
  "arguments": {
    "quoted": "He said \\"hello\\"", "path": "C:\\\\Users\\\\file.txt",
    "newline": "line1\\nline2", "unicode": "emoji: 🎉 café"
  }
}]"""
MALFORMED = [
    '<|tool_call|> [{"name": "func", "arguments": {',
    '<|tool_call|> {"name": "func", "arguments": {}}',  # not an array
    '[{"name": "func", "arguments": "not a dict"}]',
    'Some text [{"name": "func"}]',  # JSON, but not the tool call format
    '<tool_call>[{"name": "a", "arguments": {}}, {"arguments": {}}]',  # one bad element
    "[Note] just prose in brackets",
    "Ends with <|tool_",
    '<|tool_call|>[{"name": "f", "arguments": {"x": Infinity}}]',  # not JSON
]
BARE_ARRAY = '\n[{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}]\n'

GRANITE_OUTPUTS = [PLAIN, SINGLE, PARALLEL, DATA_TYPES, EMPTY_ARGS, SURROUNDED, ESCAPES, BARE_ARRAY]
GRANITE_OUTPUTS += MALFORMED


def granite_tokenizer():
    return make_tokenizer(["<|tool_call|>", "<|end_of_text|>"], GRANITE_OUTPUTS)


def parse(text: str):
    return run_nonstreaming(GraniteToolParser(granite_tokenizer()), text)


def test_registered_under_upstream_name():
    assert ToolParserManager.get_tool_parser("granite") is GraniteToolParser


@pytest.mark.parametrize("text", [PLAIN, *MALFORMED])
def test_no_call_is_the_whole_output_as_content(text):
    assert parse(text) == (text, [], False)


def test_single_call_token_and_string_markers():
    expected = (None, [("get_weather", '{"city": "Tokyo"}')], True)
    assert parse(SINGLE) == expected
    assert parse(SINGLE.replace("<|tool_call|>", "<tool_call>")) == expected


def test_parallel_calls():
    content, calls, _ = parse(PARALLEL)
    assert content is None
    assert calls == [
        ("get_weather", '{"city": "Tokyo"}'),
        ("get_time", '{"timezone": "Asia/Tokyo"}'),
    ]


def test_data_types_escapes_and_unicode():
    args = json.loads(parse(DATA_TYPES)[1][0][1])
    assert args["float_field"] == 3.14 and args["null_field"] is None and args["empty_object"] == {}
    _, calls, _ = parse(ESCAPES)
    assert json.loads(calls[0][1]) == {
        "quoted": 'He said "hello"',
        "path": "C:\\Users\\file.txt",
        "newline": "line1\nline2",
        "unicode": "emoji: 🎉 café",
    }
    assert "🎉 café" in calls[0][1]  # ensure_ascii=False, as upstream


def test_empty_arguments_and_bare_array():
    assert parse(EMPTY_ARGS) == (None, [("refresh", "{}")], True)
    assert parse(BARE_ARRAY) == (None, [("get_weather", '{"city": "Oslo"}')], True)


def test_surrounding_text_is_content():
    content, calls, _ = parse(SURROUNDED)
    assert calls == [("get_weather", '{"city": "Tokyo"}')]
    assert content == "Let me check the weather for you.\n\nI'll get that information."


@pytest.mark.parametrize("chunk", [1, 2, 3, 5])
def test_streaming_parallel_calls_in_batched_steps(chunk):
    tok = granite_tokenizer()
    got = run_streaming(GraniteToolParser(tok), tok, PARALLEL, [chunk])
    assert [name for name, _ in got.call_tuples()] == ["get_weather", "get_time"]
    assert got.content == ""


def test_streaming_surrounding_text_on_a_tokenizer_without_the_token():
    tok = embedded_tokenizer()
    got = run_streaming(GraniteToolParser(tok), tok, SURROUNDED)
    assert got.content == "Let me check the weather for you.\n\nI'll get that information."
    assert got.call_tuples() == [("get_weather", '{"city": "Tokyo"}')]
