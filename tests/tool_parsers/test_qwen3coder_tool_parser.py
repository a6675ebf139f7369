"""Qwen3CoderToolParser and Qwen3XMLToolParser: upstream's test cases
(upstream's tests/tool_parsers/test_qwen3coder_tool_parser.py, which runs both
parsers, and test_qwen3xml_tool_parser.py's common-test outputs) on a small
real tokenizer built here, with `<tool_call>`/`</tool_call>` as special tokens
(as Qwen3's) and as plain text; streaming == non-streaming for each."""

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
from vllm.tool_parsers.qwen3coder_tool_parser import (
    Qwen3CoderToolParser,
    convert_param_value,
    is_nullable,
    schema_type,
)
from vllm.tool_parsers.qwen3xml_tool_parser import Qwen3XMLToolParser

PARSERS = [Qwen3CoderToolParser, Qwen3XMLToolParser]
MARKERS = ("<tool_call>", "</tool_call>")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "state": {"type": "string"},
                    "unit": {"type": "string", "enum": ["fahrenheit", "celsius"]},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "calculate_area",
            "parameters": {
                "type": "object",
                "properties": {
                    "shape": {"type": "string"},
                    "dimensions": {"type": "object"},
                    "precision": {"type": "integer"},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "test_types",
            "parameters": {
                "type": "object",
                "properties": {
                    "int_param": {"type": "integer"},
                    "float_param": {"type": "float"},
                    "bool_param": {"type": "boolean"},
                    "str_param": {"type": "string"},
                    "obj_param": {"type": "object"},
                    "maybe": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                    "note": {"type": ["string", "null"]},
                },
            },
        },
    },
]


def weather(city: str, state: str, unit: str = "fahrenheit") -> str:
    return (
        "<tool_call>\n<function=get_current_weather>\n"
        f"<parameter=city>\n{city}\n</parameter>\n<parameter=state>\n{state}\n</parameter>\n"
        f"<parameter=unit>\n{unit}\n</parameter>\n</function>\n</tool_call>"
    )


def area(shape: str, dimensions: str, precision: str) -> str:
    return (
        "<tool_call>\n<function=calculate_area>\n"
        f"<parameter=shape>\n{shape}\n</parameter>\n"
        f"<parameter=dimensions>\n{dimensions}\n</parameter>\n"
        f"<parameter=precision>\n{precision}\n</parameter>\n</function>\n</tool_call>"
    )


DALLAS = {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}
TYPES = (
    "<tool_call>\n<function=test_types>\n<parameter=int_param>\n42\n</parameter>\n"
    "<parameter=float_param>\n3.14\n</parameter>\n<parameter=bool_param>\ntrue\n</parameter>\n"
    "<parameter=str_param>\nhello world\n</parameter>\n"
    '<parameter=obj_param>\n{"key": "value"}\n</parameter>\n'
    "<parameter=maybe>\nnull\n</parameter>\n</function>\n</tool_call>"
)

# (model output, [(name, arguments)], content) -- upstream's expectations.
CASES = [
    ("This is a test response without any tool calls", [], None),
    (weather("Dallas", "TX"), [("get_current_weather", DALLAS)], None),
    (
        "Sure! Let me check the weather for you." + weather("Dallas", "TX"),
        [("get_current_weather", DALLAS)],
        "Sure! Let me check the weather for you.",
    ),
    (
        area("rectangle", '{"width": 10, \n "height": 20}', "2"),
        [
            (
                "calculate_area",
                {"shape": "rectangle", "dimensions": {"width": 10, "height": 20}, "precision": 2},
            )
        ],
        None,
    ),
    (
        weather("Dallas", "TX") + "\n" + weather("Orlando", "FL", "celsius"),
        [
            ("get_current_weather", DALLAS),
            ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "celsius"}),
        ],
        None,
    ),
    (
        "Let me calculate that area for you." + area("circle", '{"radius": 15.5}', "3"),
        [("calculate_area", {"shape": "circle", "dimensions": {"radius": 15.5}, "precision": 3})],
        "Let me calculate that area for you.",
    ),
    # no <tool_call> wrapper (upstream's fallback)
    (
        (
            "<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n"
            "<parameter=state>\nTX\n</parameter>\n</function>"
        ),
        [("get_current_weather", {"city": "Dallas", "state": "TX"})],
        None,
    ),
    (
        TYPES,
        [
            (
                "test_types",
                {
                    "int_param": 42,
                    "float_param": 3.14,
                    "bool_param": True,
                    "str_param": "hello world",
                    "obj_param": {"key": "value"},
                    "maybe": None,
                },
            )
        ],
        None,
    ),
    # upstream's qwen3_xml common outputs: values on the tag's line, text after the call
    (
        (
            "Let me check the weather for you.\n\n<tool_call>\n<function=get_weather>\n"
            "<parameter=city>Tokyo</parameter>\n</function>\n</tool_call>\n\nI will get that information."  # noqa: E501
        ),
        [("get_weather", {"city": "Tokyo"})],
        "Let me check the weather for you.\n\n",
    ),
    ("<tool_call>\n<function=refresh>\n</function>\n</tool_call>", [("refresh", {})], None),
    (
        (
            "<tool_call>\n<function=test_function>\n"
            '<parameter=quoted>He said "hello"</parameter>\n'
            "<parameter=path>C:\\Users\\file.txt</parameter>\n"
            "<parameter=newline>line1\nline2</parameter>\n</function>\n</tool_call>"
        ),
        [
            (
                "test_function",
                {
                    "quoted": 'He said "hello"',
                    "path": "C:\\Users\\file.txt",
                    "newline": "line1\nline2",
                },
            )
        ],
        None,
    ),
    # unicode, a value with blank lines, a missing </parameter> (ends at the next one)
    (
        weather("東京 ☃", "multi\nline\n\n"),
        [
            (
                "get_current_weather",
                {"city": "東京 ☃", "state": "multi\nline\n\n", "unit": "fahrenheit"},
            )
        ],
        None,
    ),
    (
        (
            "<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n"
            "<parameter=state>\nTX\n</function>\n</tool_call>"
        ),
        [("get_current_weather", {"city": "Dallas", "state": "TX"})],
        None,
    ),
    # a nullable string: "null" is null (and is not streamed as a string first)
    (
        (
            "<tool_call>\n<function=test_types>\n<parameter=note>\nnull\n</parameter>\n"
            "<parameter=str_param>\nnull\n</parameter>\n</function>\n</tool_call>"
        ),
        [("test_types", {"note": None, "str_param": "null"})],
        None,
    ),
    # cut off by max_tokens inside a call: upstream keeps what was written
    ("<tool_call><function=func>", [("func", {})], None),
]

MALFORMED = [
    "<tool_call><function=></function></tool_call>",
    "<tool_call>\nno function here\n</tool_call>",
    "<tool_call>\n<function=two words>\n</function>\n</tool_call>",
]


def qwen3_request():
    return make_request(TOOLS)


def tokenizer(markers=MARKERS):
    corpus = [out for out, _, _ in CASES] + MALFORMED
    return make_tokenizer(markers, corpus, vocab_size=600)


def _calls(result) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in result.tool_calls]


@pytest.mark.parametrize("parser_cls", PARSERS)
@pytest.mark.parametrize(("output", "calls", "content"), CASES)
def test_extract(parser_cls, output, calls, content):
    result = parser_cls(tokenizer()).extract_tool_calls(output, make_request(TOOLS))
    assert result.tools_called == bool(calls)
    assert _calls(result) == calls
    assert result.content == (content if calls else output)


@pytest.mark.parametrize("parser_cls", PARSERS)
@pytest.mark.parametrize("output", MALFORMED)
def test_malformed_is_content(parser_cls, output):
    result = parser_cls(tokenizer()).extract_tool_calls(output, make_request(TOOLS))
    assert (result.tools_called, result.tool_calls, result.content) == (False, [], output)


def test_without_a_schema_values_stay_strings():
    # upstream: a parameter the tool's schema does not declare is a string
    result = Qwen3CoderToolParser(tokenizer()).extract_tool_calls(TYPES, make_request(()))
    assert json.loads(result.tool_calls[0].function.arguments)["int_param"] == "42"


@pytest.mark.parametrize(
    ("value", "schema", "expected"),
    [
        ("42", {"type": "integer"}, 42),
        ("x", {"type": "integer"}, "x"),
        ("3.0", {"type": "number"}, 3),
        ("2.5", {"type": "float"}, 2.5),
        ("True", {"type": "boolean"}, True),
        ("null", {"type": "string"}, "null"),
        ("null", {"type": "object"}, None),
        ("[1, 2]", {"type": "array"}, [1, 2]),
        ("{'a': 1}", {"type": "object"}, {"a": 1}),
        ("7", {"anyOf": [{"type": "null"}, {"type": "integer"}]}, 7),
        ("7", {"type": ["integer", "null"]}, 7),
        ("7", {}, "7"),
        ("null", {"anyOf": [{"type": "string"}, {"type": "null"}]}, None),
        ("None", {"type": ["string", "null"]}, None),
        ("nullish", {"type": ["string", "null"]}, "nullish"),
    ],
)
def test_param_conversion(value, schema, expected):
    assert convert_param_value(value, schema_type(schema), is_nullable(schema)) == expected


def test_token_ids_and_registry():
    assert Qwen3CoderToolParser(tokenizer()).tool_call_start_token_id is not None
    assert Qwen3CoderToolParser(tokenizer(())).tool_call_start_token_id is None
    assert ToolParserManager.get_tool_parser("qwen3_coder") is Qwen3CoderToolParser
    assert ToolParserManager.get_tool_parser("qwen3_xml") is Qwen3XMLToolParser


QWEN3_OUTPUTS = [out for out, _, _ in CASES] + MALFORMED


@pytest.mark.parametrize("parser_cls", PARSERS)
@pytest.mark.parametrize("markers", [MARKERS, ()], ids=["special-tokens", "text"])
def test_streaming_equals_non_streaming(parser_cls, markers):
    tok = tokenizer(markers)
    for output in QWEN3_OUTPUTS:
        request = make_request(TOOLS)
        content, calls, _ = run_nonstreaming(parser_cls(tok), output, request)
        for chunks in chunkings(seed=len(output)):
            got = run_streaming(parser_cls(tok), tok, output, chunks, request)
            assert (got.content, got.call_tuples()) == (content or "", calls), (output, chunks)


def test_string_values_stream_as_written():
    out = weather("a long city name that comes in many pieces", "TX")
    got = run_streaming(
        Qwen3CoderToolParser(tokenizer()), tokenizer(), out, [1], make_request(TOOLS)
    )
    pieces = [
        tc.function.arguments
        for d in got.deltas
        for tc in d.tool_calls
        if tc.function and tc.function.arguments
    ]
    assert len(pieces) > 5 and "".join(pieces) == got.calls[0][1]


def _cuts(tok, output: str):
    ids = tok.encode(output, add_special_tokens=False)
    texts = (tok.decode(ids[:n], skip_special_tokens=False) for n in range(1, len(ids)))
    return [t for t in texts if not t.endswith("\ufffd")]


@pytest.mark.parametrize("markers", [MARKERS, ()], ids=["special-tokens", "text"])
def test_cut_off_anywhere(markers):
    """max_tokens may stop the output at any token: for every such prefix of a
    two-call output, the stream (and its finish) gives the non-streamed answer."""
    tok = tokenizer(markers)
    request = make_request(TOOLS)
    output = "Checking." + weather("Dallas", "TX") + area("circle", '{"radius": 1.5}', "3")
    for text in _cuts(tok, output):
        content, calls, _ = run_nonstreaming(Qwen3CoderToolParser(tok), text, request)
        got = run_streaming(Qwen3CoderToolParser(tok), tok, text, [1], request)
        assert (got.content, got.call_tuples()) == (content or "", calls), text


@pytest.mark.parametrize("markers", [MARKERS, ()], ids=["special-tokens", "text"])
def test_mutated_outputs_stream_as_non_streamed(markers):
    """Near-miss outputs (a property test: it found the first-value-wins rule
    for repeated parameters): never an error, streamed == non-streamed."""
    tok = tokenizer(markers)
    request = make_request(TOOLS)
    for output in mutated_outputs(QWEN3_OUTPUTS, seed=len(markers), n=60):
        content, calls, _ = run_nonstreaming(Qwen3CoderToolParser(tok), output, request)
        got = run_streaming(Qwen3CoderToolParser(tok), tok, output, [1, 2, 3], request)
        assert (got.content, got.call_tuples()) == (content or "", calls), output
