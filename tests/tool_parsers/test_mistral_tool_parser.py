"""MistralToolParser: upstream's test cases (upstream's
tests/tool_parsers/test_mistral_tool_parser.py) for both formats, on small
real tokenizers built here: with the family's markers as special tokens, and
with `[TOOL_CALLS]` as plain text split over several tokens. Streaming ==
non-streaming for every case is checked here and in
test_streaming_equivalence.py (MISTRAL_STREAMING)."""

from __future__ import annotations

import json
import random

import pytest

from tests.tool_parsers.utils import (
    chunkings,
    make_request,
    make_tokenizer,
    run_nonstreaming,
    run_streaming,
)
from vllm.entrypoints.openai.protocol import ChatCompletionRequest
from vllm.tool_parsers import ToolParserManager
from vllm.tool_parsers.mistral_tool_parser import MistralToolCall, MistralToolParser

REQUEST = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}])
PRE_V11 = ("[TOOL_CALLS]",)
V11 = ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")
V11_TEXT = ("[ARGS]",)  # a v11 vocabulary, [TOOL_CALLS] written as text
WEATHER = {"city": "San Francisco", "state": "CA", "unit": "celsius"}

# (model output, [(name, arguments)], content) -- upstream's expectations.
PRE_V11_CASES = [
    ("This is a test", [], "This is a test"),
    (
        '[TOOL_CALLS][{"name": "add", "arguments":{"a": 3.5, "b": 4}}]',
        [("add", {"a": 3.5, "b": 4})],
        None,
    ),
    (
        (
            '[TOOL_CALLS] [{"name": "get_current_weather", "arguments":{"city": "San Francisco", '
            '"state": "CA", "unit": "celsius"}}]'
        ),
        [("get_current_weather", WEATHER)],
        None,
    ),
    (
        (
            '[TOOL_CALLS] [{"arguments":{"city": "San Francisco", "state": "CA", "unit": "celsius"}, '  # noqa: E501
            '"name": "get_current_weather"}]'
        ),
        [("get_current_weather", WEATHER)],
        None,
    ),
    (
        '[TOOL_CALLS] [{"arguments":{"name": "John Doe"}, "name": "get_age"}]',
        [("get_age", {"name": "John Doe"})],
        None,
    ),
    (
        (
            '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 3.5, "b": 4}}, {"name": '
            '"get_current_weather", "arguments":{"city": "San Francisco", "state": "CA", "unit": "celsius"}}]'  # noqa: E501
        ),
        [("add", {"a": 3.5, "b": 4}), ("get_current_weather", WEATHER)],
        None,
    ),
    (
        'Hello[TOOL_CALLS] [{"name": "add", "arguments":{"a": 1, "b": 2}}]',
        [("add", {"a": 1, "b": 2})],
        "Hello",
    ),
    (
        (
            '[TOOL_CALLS] [{"name": "get_current_weather", "arguments":{"city": "Dallas", "state": "TX", '  # noqa: E501
            '"unit": "fahrenheit"}}]\nextra trailing data'
        ),
        [("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"})],
        None,
    ),
    # upstream's regex fallback: junk before the array
    (
        '[TOOL_CALLS]  junk [{"name": "add", "arguments":{"a": 1, "b": 2}}] trail',
        [("add", {"a": 1, "b": 2})],
        None,
    ),
    # broken after the call began streaming: kept as far as it was JSON
    ('[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1, "b": oops}}]', [("f", {"a": 1})], None),
    (
        '[TOOL_CALLS] [{"name": "translate", "arguments": {"text": "東京 ☃ é"}}]',
        [("translate", {"text": "東京 ☃ é"})],
        None,
    ),
]

V11_CASES = [
    ("This is a test", [], "This is a test"),
    (
        '[TOOL_CALLS]add_this_and_that{"a": 3.5, "b": 4}',
        [("add_this_and_that", {"a": 3.5, "b": 4})],
        None,
    ),
    (
        '[TOOL_CALLS]get_current_weather{"city": "San Francisco", "state": "CA", "unit": "celsius"}',  # noqa: E501
        [("get_current_weather", WEATHER)],
        None,
    ),
    (
        '[TOOL_CALLS]add{"a": 3.5, "b": 4}[TOOL_CALLS]multiply{"a": 3, "b": 6}',
        [("add", {"a": 3.5, "b": 4}), ("multiply", {"a": 3, "b": 6})],
        None,
    ),
    (
        'bla[TOOL_CALLS]add_this_and_that{"a": 3.5, "b": 4}',
        [("add_this_and_that", {"a": 3.5, "b": 4})],
        "bla",
    ),
    (
        """hi{hi[TOOL_CALLS]bash{"command": "print(\\"hello world!\\")\\nre.compile(r'{}')"}""",
        [("bash", {"command": "print(\"hello world!\")\nre.compile(r'{}')"})],
        "hi{hi",
    ),
    ('[TOOL_CALLS]f[ARGS]{"a": 1, "b": oops}', [("f", {"a": 1})], None),
    # as the HF tokenizer writes it: [ARGS] between name and arguments
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "東京"}', [("get_weather", {"city": "東京"})], None),
    # cut off by max_tokens: upstream keeps the call; its arguments are completed here
    (
        """hi{hi[TOOL_CALLS]bash{"command": "print(\\"hello world!\\")\\nre.compile(r'{}')\"""",
        [("bash", {"command": "print(\"hello world!\")\nre.compile(r'{}')"})],
        "hi{hi",
    ),
]


def family_tokenizer(markers: tuple[str, ...]):
    corpus = [out for out, _, _ in PRE_V11_CASES + V11_CASES]
    return make_tokenizer(markers, corpus, vocab_size=600)


def _parser(markers: tuple[str, ...]) -> MistralToolParser:
    return MistralToolParser(family_tokenizer(markers))


def _calls(result) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in result.tool_calls]


@pytest.mark.parametrize(("output", "calls", "content"), PRE_V11_CASES)
def test_pre_v11_extract(output, calls, content):
    result = _parser(PRE_V11).extract_tool_calls(output, REQUEST)
    assert result.tools_called == bool(calls)
    assert _calls(result) == calls
    assert result.content == content
    for call in result.tool_calls:
        assert MistralToolCall.is_valid_id(call.id)


@pytest.mark.parametrize(("output", "calls", "content"), V11_CASES)
def test_v11_extract(output, calls, content):
    result = _parser(V11).extract_tool_calls(output, REQUEST)
    assert result.tools_called == bool(calls)
    assert _calls(result) == calls
    assert result.content == content


def test_arguments_keep_unicode_as_upstream():
    # upstream dumps arguments with ensure_ascii=False
    out = '[TOOL_CALLS] [{"name": "t", "arguments": {"q": "\\u6771\\u4eac"}}]'
    assert _parser(PRE_V11).extract_tool_calls(out, REQUEST).tool_calls[0].function.arguments == (
        '{"q": "東京"}'
    )


MALFORMED = [
    "[TOOL_CALLS] not json at all",
    "[TOOL_CALLS]toolname_no_args",
    "Sure.[TOOL_CALLS]two words{}",
    '[TOOL_CALLS] [{"arguments": {"a": 1}}]',
]


@pytest.mark.parametrize(
    ("markers", "output"),
    [(PRE_V11, MALFORMED[0]), (V11, MALFORMED[1]), (V11, MALFORMED[2]), (PRE_V11, MALFORMED[3])],
)
def test_malformed_call_is_content(markers, output):
    """Call text that does not parse comes back as content (upstream drops the
    [TOOL_CALLS] prefix in the first case and returns no content in the
    second; the issue asks for the text back)."""
    result = _parser(markers).extract_tool_calls(output, REQUEST)
    assert (result.tools_called, result.tool_calls, result.content) == (False, [], output)


def test_several_bot_tokens_pre_v11_do_not_raise():
    # upstream raises ValueError ("Only one BOT token") -> a 500; here both arrays count
    out = '[TOOL_CALLS] [{"name": "add", "arguments":{"a": 1}}][TOOL_CALLS] [{"name": "sub", "arguments":{"b": 2}}]'  # noqa: E501
    assert _calls(_parser(PRE_V11).extract_tool_calls(out, REQUEST)) == [
        ("add", {"a": 1}),
        ("sub", {"b": 2}),
    ]


def test_v13_call_id_becomes_the_id():
    out = '[TOOL_CALLS]get[CALL_ID]abc123XYZ[ARGS]{"city": "x"}'
    result = _parser(V11).extract_tool_calls(out, REQUEST)
    assert [(c.id, c.function.name) for c in result.tool_calls] == [("abc123XYZ", "get")]
    got = run_streaming(_parser(V11), family_tokenizer(V11), out, [1])
    assert got.calls == [["get", '{"city": "x"}']]
    assert got.deltas[0].tool_calls[0].id == "abc123XYZ"
    bad_id = _parser(V11).extract_tool_calls(out.replace("abc123XYZ", "not-an-id"), REQUEST)
    assert MistralToolCall.is_valid_id(bad_id.tool_calls[0].id)


def test_format_follows_the_tokenizer():
    assert _parser(PRE_V11)._is_pre_v11 and not _parser(V11)._is_pre_v11
    assert _parser(V11).bot_token_id == family_tokenizer(V11).convert_tokens_to_ids("[TOOL_CALLS]")
    assert _parser(()).bot_token_id is None  # no such token: found in the text
    assert _parser(V11_TEXT).bot_token_id is None and not _parser(V11_TEXT)._is_pre_v11


def test_registry_and_adjust_request():
    assert ToolParserManager.get_tool_parser("mistral") is MistralToolParser
    request = ChatCompletionRequest(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        tools=[{"type": "function", "function": {"name": "add"}}],
    )
    assert _parser(V11).adjust_request(request).skip_special_tokens is False


def test_text_path_and_token_path_agree():
    out = 'Hi[TOOL_CALLS]add[ARGS]{"a": 1}'
    for markers in (V11, V11_TEXT):
        ids = family_tokenizer(markers).encode(out, add_special_tokens=False)
        n_ids = 1 if markers == V11 else 2  # [TOOL_CALLS]: one id, or split
        assert len(ids) > n_ids
        result = _parser(markers).extract_tool_calls(out, REQUEST)
        assert _calls(result) == [("add", {"a": 1})] and result.content == "Hi"


# (tokenizer markers, outputs) for the streaming-equivalence harness.
MISTRAL_STREAMING = [
    (PRE_V11, [out for out, _, _ in PRE_V11_CASES] + MALFORMED[:1] + MALFORMED[3:]),
    ((), [out for out, _, _ in PRE_V11_CASES]),
    (V11, [out for out, _, _ in V11_CASES] + MALFORMED[1:3]),
    (V11_TEXT, [out for out, _, _ in V11_CASES] + MALFORMED[1:3]),
]


@pytest.mark.parametrize(("markers", "outputs"), MISTRAL_STREAMING)
def test_streaming_equals_non_streaming(markers, outputs):
    """Token by token, all at once and in random chunks, with [TOOL_CALLS] one
    special token or plain text: the deltas rebuild the non-streamed answer."""
    tokenizer = family_tokenizer(markers)
    for output in outputs:
        content, calls, _ = run_nonstreaming(MistralToolParser(tokenizer), output, make_request())
        for chunks in chunkings(seed=len(output)):
            got = run_streaming(MistralToolParser(tokenizer), tokenizer, output, chunks)
            assert (got.content, got.call_tuples()) == (content or "", calls), (output, chunks)
        for _, arguments in calls:
            json.loads(arguments)


def test_arguments_stream_as_written():
    """Arguments arrive piece by piece (not in one delta at the end), and no
    piece is ever taken back: each is a prefix of the final text."""
    out = '[TOOL_CALLS]write[ARGS]{"path": "a.txt", "text": "one two three four five six"}'
    got = run_streaming(_parser(V11), family_tokenizer(V11), out, [1])
    pieces = [
        tc.function.arguments
        for d in got.deltas
        for tc in d.tool_calls
        if tc.function and tc.function.arguments
    ]
    assert len(pieces) > 5
    assert "".join(pieces) == got.calls[0][1]


@pytest.mark.parametrize(
    ("markers", "output"),
    [
        (
            PRE_V11,
            (
                'Hi[TOOL_CALLS] [{"name": "add", "arguments": {"a": 3.5}}, '
                '{"arguments": {"q": "東京"}, "name": "s"}]'
            ),
        ),
        (V11, 'Hi[TOOL_CALLS]add[ARGS]{"a": 3.5, "b": [true]}[TOOL_CALLS]s[ARGS]{"q": "東京"}'),
    ],
    ids=["pre_v11", "v11"],
)
def test_cut_off_anywhere(markers, output):
    """max_tokens may stop the output at any token: for every such prefix of a
    two-call output, the stream (and its finish) gives the non-streamed answer."""
    tok = family_tokenizer(markers)
    ids = tok.encode(output, add_special_tokens=False)
    for n in range(1, len(ids)):
        text = tok.decode(ids[:n], skip_special_tokens=False)
        if text.endswith("\ufffd"):
            continue
        content, calls, _ = run_nonstreaming(MistralToolParser(tok), text, make_request())
        got = run_streaming(MistralToolParser(tok), tok, text, [1])
        assert (got.content, got.call_tuples()) == (content or "", calls), text


def mutated_outputs(outputs: list[str], seed: int, n: int) -> list[str]:
    """`n` seeded near-miss outputs: fixtures with a span deleted, repeated,
    or spliced from another (broken markers, JSON, names, unicode...)."""
    rng = random.Random(seed)
    mutated = []
    for _ in range(n):
        a, b = rng.choice(outputs), rng.choice(outputs)
        i, j = sorted(rng.sample(range(len(a) + 1), 2))
        mutated.append(
            rng.choice([a[:i] + a[j:], a[:j] + a[i:], a[:i] + b[:j] + a[i:], a[:i] + b[i:]])
        )
    return mutated


@pytest.mark.parametrize(("markers", "outputs"), MISTRAL_STREAMING)
def test_mutated_outputs_stream_as_non_streamed(markers, outputs):
    """Near-miss outputs (a property test: it found each hold-back rule the
    parser has): never an error, valid JSON arguments, streamed == non-streamed."""
    tokenizer = family_tokenizer(markers)
    for output in mutated_outputs(outputs, seed=len(markers), n=60):
        content, calls, _ = run_nonstreaming(MistralToolParser(tokenizer), output, make_request())
        for _, arguments in calls:
            json.loads(arguments)
        got = run_streaming(MistralToolParser(tokenizer), tokenizer, output, [1, 2, 3])
        assert (got.content, got.call_tuples()) == (content or "", calls), output
