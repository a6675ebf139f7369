"""DeepSeekV3ToolParser: upstream's test cases (upstream's
tests/tool_parsers/test_deepseekv3_tool_parser.py, the common parser tests'
outputs) on small real tokenizers built here, with the markers as special
tokens and as plain text; streaming == non-streaming for each."""

from __future__ import annotations

import json

import pytest

from tests.tool_parsers.test_mistral_tool_parser import mutated_outputs
from tests.tool_parsers.utils import (
    chunkings,
    make_request,
    make_tokenizer,
    run_nonstreaming,
    run_streaming,
)
from vllm.tool_parsers import ToolParserManager
from vllm.tool_parsers.deepseekv3_tool_parser import DeepSeekV3ToolParser

P = DeepSeekV3ToolParser
MARKERS = (
    P.tool_calls_start_token,
    P.tool_calls_end_token,
    P.tool_call_start_token,
    P.tool_call_end_token,
    P.tool_sep_token,
)


def call(name: str, arguments: str) -> str:
    return f"{P.tool_call_start_token}function{P.tool_sep_token}{name}\n```json\n{arguments}\n```{P.tool_call_end_token}"  # noqa: E501


def block(*calls: str) -> str:
    return P.tool_calls_start_token + "".join(calls) + P.tool_calls_end_token


VARIOUS = (
    '{"string_field": "hello", "int_field": 42, "float_field": 3.14, "bool_field": true, '
    '"null_field": null, "array_field": ["a", "b", "c"], "object_field": {"nested": "value"}, '
    '"empty_array": [], "empty_object": {}}'
)
ESCAPED = (
    '{"text": "He said \\"hello\\"", "path": "C:\\\\Users\\\\file", "newline": "line1\\nline2"}'
)

# (model output, [(name, arguments)], content)
CASES = [
    ("How can I help you today? I can check weather for you.", [], None),
    (
        block(call("get_weather", '{"city": "Tokyo", "unit": "celsius"}')),
        [("get_weather", {"city": "Tokyo", "unit": "celsius"})],
        None,
    ),
    (
        block(
            call("get_weather", '{"city": "Tokyo", "unit": "celsius"}'),
            call("search_hotels", '{"location": "Tokyo", "check_in": "2025-01-15"}'),
        ),
        [
            ("get_weather", {"city": "Tokyo", "unit": "celsius"}),
            ("search_hotels", {"location": "Tokyo", "check_in": "2025-01-15"}),
        ],
        None,
    ),
    (block(call("test_function", VARIOUS)), [("test_function", json.loads(VARIOUS))], None),
    (block(call("get_current_time", "{}")), [("get_current_time", {})], None),
    (
        "Let me check the weather for you." + block(call("get_weather", '{"city": "Paris"}')),
        [("get_weather", {"city": "Paris"})],
        "Let me check the weather for you.",
    ),
    (block(call("send_message", ESCAPED)), [("send_message", json.loads(ESCAPED))], None),
    (block(call("translate", '{"text": "東京 ☃ é"}')), [("translate", {"text": "東京 ☃ é"})], None),
    # upstream's first malformed output: the object is cut off; it stays a
    # call (as upstream) with its arguments completed to valid JSON
    (block(call("get_weather", '{"city": "Tokyo"')), [("get_weather", {"city": "Tokyo"})], None),
    # arguments broken after they began streaming: a streamed call cannot be
    # taken back, so both modes keep the arguments as far as they were JSON
    (
        block(call("get_weather", '{"unit": "celsius", "city": Tokyo}')),
        [("get_weather", {"unit": "celsius"})],
        None,
    ),
]

# Upstream's second malformed output (no call-begin marker) and more: no call.
MALFORMED = [
    P.tool_calls_start_token
    + f'function{P.tool_sep_token}get_weather\n```json\n{{"city": "Tokyo"}}\n```'
    + P.tool_calls_end_token,
    block(call("get_weather", "[1, 2]")),  # arguments that are not an object
    block(
        f"{P.tool_call_start_token}api{P.tool_sep_token}f\n```json\n{{}}\n```{P.tool_call_end_token}"
    ),
    "Text " + P.tool_calls_start_token + "cut off",
]


def tokenizer(markers=MARKERS):
    corpus = [out for out, _, _ in CASES] + MALFORMED
    return make_tokenizer(markers, corpus, vocab_size=600)


def _calls(result) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in result.tool_calls]


@pytest.mark.parametrize(("output", "calls", "content"), CASES)
def test_extract(output, calls, content):
    result = DeepSeekV3ToolParser(tokenizer()).extract_tool_calls(output, make_request())
    assert result.tools_called == bool(calls)
    assert _calls(result) == calls
    assert result.content == (content if calls else output)


@pytest.mark.parametrize("output", MALFORMED)
def test_malformed_is_content(output):
    """Upstream returns tools_called=True with no calls for the first (its
    common tests mark that xfail); here the text comes back as content."""
    result = DeepSeekV3ToolParser(tokenizer()).extract_tool_calls(output, make_request())
    assert (result.tools_called, result.tool_calls, result.content) == (False, [], output)


def test_text_after_the_block_is_dropped_and_a_failed_block_is_content():
    out = "A" + block("junk") + "B" + block(call("f", '{"x": 1}')) + "C"
    result = DeepSeekV3ToolParser(tokenizer()).extract_tool_calls(out, make_request())
    assert result.content == "A" + block("junk") + "B"
    assert _calls(result) == [("f", {"x": 1})]


def test_token_ids_and_registry():
    parser = DeepSeekV3ToolParser(tokenizer())
    assert parser.tool_calls_start_token_id == tokenizer().convert_tokens_to_ids(
        P.tool_calls_start_token
    )
    assert DeepSeekV3ToolParser(tokenizer(())).tool_calls_start_token_id is None
    assert ToolParserManager.get_tool_parser("deepseek_v3") is DeepSeekV3ToolParser


DEEPSEEK_OUTPUTS = [out for out, _, _ in CASES] + MALFORMED


@pytest.mark.parametrize("markers", [MARKERS, ()], ids=["special-tokens", "text"])
def test_streaming_equals_non_streaming(markers):
    tok = tokenizer(markers)
    for output in DEEPSEEK_OUTPUTS:
        content, calls, _ = run_nonstreaming(DeepSeekV3ToolParser(tok), output)
        for chunks in chunkings(seed=len(output)):
            got = run_streaming(DeepSeekV3ToolParser(tok), tok, output, chunks)
            assert (got.content, got.call_tuples()) == (content or "", calls), (output, chunks)


@pytest.mark.parametrize("markers", [MARKERS, ()], ids=["special-tokens", "text"])
def test_cut_off_anywhere(markers):
    """max_tokens may stop the output at any token: for every such prefix of a
    two-call output, the stream (and its finish) gives the non-streamed answer."""
    tok = tokenizer(markers)
    output = "Sure." + block(call("get_weather", '{"city": "東京"}'), call("f", '{"a": [1, 2.5]}'))
    ids = tok.encode(output, add_special_tokens=False)
    for n in range(1, len(ids)):
        text = tok.decode(ids[:n], skip_special_tokens=False)
        if text.endswith("\ufffd"):
            continue
        content, calls, _ = run_nonstreaming(DeepSeekV3ToolParser(tok), text)
        got = run_streaming(DeepSeekV3ToolParser(tok), tok, text, [1])
        assert (got.content, got.call_tuples()) == (content or "", calls), text


@pytest.mark.parametrize("markers", [MARKERS, ()], ids=["special-tokens", "text"])
def test_mutated_outputs_stream_as_non_streamed(markers):
    """Near-miss outputs (a property test: it found each hold-back rule the
    parser has): never an error, valid JSON arguments, streamed == non-streamed."""
    tok = tokenizer(markers)
    for output in mutated_outputs(DEEPSEEK_OUTPUTS, seed=len(markers), n=60):
        content, calls, _ = run_nonstreaming(DeepSeekV3ToolParser(tok), output)
        for _, arguments in calls:
            json.loads(arguments)
        got = run_streaming(DeepSeekV3ToolParser(tok), tok, output, [1, 2, 3])
        assert (got.content, got.call_tuples()) == (content or "", calls), output
