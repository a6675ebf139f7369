"""Llama 3 JSON parser (`llama3_json`, `llama4_json`): upstream's test cases
(tests/tool_parsers/test_llama3_json_tool_parser.py upstream) on a small real
tokenizer with Llama's `<|python_tag|>` / `<|eot_id|>` special tokens."""

from __future__ import annotations

import json

import pytest

from tests.tool_parsers.utils import make_tokenizer, run_nonstreaming, run_streaming
from vllm.tool_parsers import ToolParserManager
from vllm.tool_parsers.llama_tool_parser import Llama3JsonToolParser

PLAIN = "This is just some text without any tool calls"
SIMPLE = 'Here is the result: {"name": "getOpenIncidentsTool", "parameters": {}}'
WITH_ARGS = '{"name": "searchTool", "parameters": {"query": "test query", "limit": 10}}'
PYTHON_TAG = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Tokyo"}}'
ARGUMENTS_KEY = '{"name": "searchTool", "arguments": {"query": "test"}}'
MULTIPLE = (
    '{"name": "searchTool", "parameters": {"query": "test1"}}; '
    '{"name": "getOpenIncidentsTool", "parameters": {}}; '
    '{"name": "searchTool", "parameters": {"query": "test2"}}'
)
MULTIPLE_SPACED = MULTIPLE.replace("}; {", "} ; {")
SURROUNDED = (
    "Here are the results: "
    '{"name": "searchTool", "parameters": {"query": "test1"}}; '
    '{"name": "getOpenIncidentsTool", "parameters": {}} '
    "Would you like to know more?"
)
INVALID = '{"name": "invalidTool", "parameters": {invalid json}'
MISSING_NAME = '{"parameters": {}}'
MISSING_PARAMS = '{"name": "toolWithoutParams"}'
BRACE_TRAILING = (
    '{"name": "searchTool", "parameters": {"query": "test"}} I used {searchTool} for this.'
)
JSON_TRAILING = (
    '{"name": "searchTool", "parameters": {"query": "test"}} '
    'The arguments I passed were {"query": "test"}'
)
NESTED = (
    '{"name": "complexTool", "parameters": {"level1": {"level2": {"level3": '
    '{"level4": {"value": "deep"}}}}}}'
)
QUOTES = (
    '{"name": "parserTool", "parameters": {"text": "He said \\"Hello {world}\\"", '
    '"q": "test {value} [complex]"}}'
)
NON_FINITE = '{"name": "f", "parameters": {"x": 1e999}}; {"name": "g", "parameters": {"y": NaN}}'
UNICODE = '{"name": "translate", "parameters": {"text": "naïve café ☕ 日本", "e": "\\u00e9"}}'
TRUNCATED = '{"name": "searchTool", "parameters": {"query": "te'
CODE = 'Use `if (x) { return y; }` in C, or {} and {"a": 1} in JSON.'

LLAMA_OUTPUTS = [
    PLAIN,
    SIMPLE,
    WITH_ARGS,
    PYTHON_TAG,
    ARGUMENTS_KEY,
    MULTIPLE,
    MULTIPLE_SPACED,
    MULTIPLE.replace("; ", ";\n"),
    MULTIPLE.replace("; ", "\n"),
    SURROUNDED,
    INVALID,
    MISSING_NAME,
    MISSING_PARAMS,
    BRACE_TRAILING,
    JSON_TRAILING,
    NESTED,
    QUOTES,
    UNICODE,
    TRUNCATED,
    CODE,
    NON_FINITE,
    "  " + WITH_ARGS + " ;\n",
    "<|python_tag|>print('no json here')",
    "Ends with <|python",
    'Sure! <|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}',
]


def llama_tokenizer():
    return make_tokenizer(["<|python_tag|>", "<|eot_id|>"], LLAMA_OUTPUTS)


def parse(text: str):
    return run_nonstreaming(Llama3JsonToolParser(llama_tokenizer()), text)


def test_registered_under_both_upstream_names():
    assert ToolParserManager.get_tool_parser("llama3_json") is Llama3JsonToolParser
    assert ToolParserManager.get_tool_parser("llama4_json") is Llama3JsonToolParser


@pytest.mark.parametrize(
    "text", [PLAIN, INVALID, MISSING_NAME, MISSING_PARAMS, TRUNCATED, CODE, NON_FINITE]
)
def test_no_call_is_the_whole_output_as_content(text):
    assert parse(text) == (text, [], False)


def test_simple_call_after_prose():
    content, calls, _ = parse(SIMPLE)
    assert calls == [("getOpenIncidentsTool", "{}")]
    # upstream's streamed result keeps the prose (its non-streamed one drops it)
    assert content == "Here is the result: "


@pytest.mark.parametrize("text", [WITH_ARGS, PYTHON_TAG, ARGUMENTS_KEY, "  " + WITH_ARGS + " ;\n"])
def test_only_calls_give_content_none(text):
    content, calls, tools_called = parse(text)
    assert content is None and tools_called and len(calls) == 1


def test_python_tag_after_prose_is_dropped():
    text = LLAMA_OUTPUTS[-1]
    assert parse(text) == ("Sure! ", [("get_weather", '{"city": "Oslo"}')], True)


def test_arguments_or_parameters():
    assert parse(WITH_ARGS)[1] == [("searchTool", '{"query": "test query", "limit": 10}')]
    assert parse(ARGUMENTS_KEY)[1] == [("searchTool", '{"query": "test"}')]


@pytest.mark.parametrize("sep", ["; ", " ; ", ";", ";\n", "\n"])
def test_several_calls_with_any_separator(sep):
    content, calls, _ = parse(MULTIPLE.replace("; ", sep))
    assert content is None
    assert [n for n, _ in calls] == ["searchTool", "getOpenIncidentsTool", "searchTool"]
    assert calls[1][1] == "{}" and json.loads(calls[2][1]) == {"query": "test2"}


def test_surrounding_text_keeps_calls():
    content, calls, _ = parse(SURROUNDED)
    assert [n for n, _ in calls] == ["searchTool", "getOpenIncidentsTool"]
    assert content == "Here are the results: Would you like to know more?"


@pytest.mark.parametrize("text", [BRACE_TRAILING, JSON_TRAILING])
def test_braces_in_trailing_text_do_not_discard_the_call(text):
    content, calls, _ = parse(text)
    assert calls == [("searchTool", '{"query": "test"}')]
    assert content == text[text.index("}} ") + 3 :]


def test_nesting_quotes_and_unicode():
    assert json.loads(parse(NESTED)[1][0][1])["level1"]["level2"]["level3"]["level4"] == {
        "value": "deep"
    }
    args = json.loads(parse(QUOTES)[1][0][1])
    assert args == {"text": 'He said "Hello {world}"', "q": "test {value} [complex]"}
    assert parse(UNICODE)[1] == [("translate", '{"text": "naïve café ☕ 日本", "e": "é"}')]


@pytest.mark.parametrize("chunk", [1, 7])
def test_streaming_parallel_calls(chunk):
    tok = llama_tokenizer()
    got = run_streaming(Llama3JsonToolParser(tok), tok, MULTIPLE.replace("; ", ";\n"), [chunk])
    assert [n for n, _ in got.call_tuples()] == ["searchTool", "getOpenIncidentsTool", "searchTool"]
    assert got.content == ""


def test_streaming_sends_each_call_as_soon_as_it_is_complete():
    tok = llama_tokenizer()
    parser = Llama3JsonToolParser(tok)
    got = run_streaming(parser, tok, MULTIPLE)
    call_steps = [i for i, d in enumerate(got.deltas) if d.tool_calls]
    assert len(call_steps) == 3 and call_steps[-1] < len(got.deltas)
    assert parser.prev_tool_call_arr[0] == {"name": "searchTool", "arguments": {"query": "test1"}}
