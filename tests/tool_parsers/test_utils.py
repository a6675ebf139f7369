"""vllm/tool_parsers/utils.py: upstream's JSON helpers, the marker and
JSON-prefix checks the streaming parsers rely on, and the end-of-stream flush."""

from __future__ import annotations

import json

import pytest
from partial_json_parser.core.options import Allow

from tests.tool_parsers.test_hermes_tool_parser import ONE_CALL, hermes_tokenizer
from tests.tool_parsers.utils import make_request
from vllm.tool_parsers.abstract_tool_parser import ToolParser
from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser
from vllm.tool_parsers.utils import (
    consume_space,
    find_common_prefix,
    flush_tool_call_stream,
    is_complete_json,
    is_json_prefix,
    partial_json_loads,
    partial_marker_len,
)

VALUE = {"a": -1.5e3, "b": 'x"é\\', "c": None, "d": [True, False, {}], "🎉": "日本"}


def test_upstream_json_helpers():
    assert find_common_prefix('{"a": 1', '{"a": 12}') == '{"a": 1'
    assert find_common_prefix("", "x") == ""
    assert partial_json_loads('{"a": [1, 2', Allow.ALL) == ({"a": [1, 2]}, 11)
    # a complete value followed by other text: parsed up to its end
    assert partial_json_loads('{"a": 1}; {"b": 2}', Allow.ALL) == ({"a": 1}, 8)
    assert is_complete_json('{"a": 1}') and not is_complete_json('{"a": 1')
    assert consume_space(0, " \n\tx") == 3 and consume_space(2, "ab") == 2


@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_every_prefix_of_valid_json_is_a_json_prefix(ensure_ascii):
    text = json.dumps(VALUE, ensure_ascii=ensure_ascii, indent=1)
    assert all(is_json_prefix(text[:n]) for n in range(1, len(text) + 1))


@pytest.mark.parametrize("text", ["{invalid", '{"a" 1', "{ return x; }", '{"a": 1}}', "[1,,"])
def test_text_that_cannot_become_json(text):
    assert not is_json_prefix(text)


def test_partial_marker_len():
    markers = ["<tool_call>", "<|python_tag|>"]
    assert partial_marker_len("text <tool_ca", markers) == len("<tool_ca")
    assert partial_marker_len("text <|py", markers) == len("<|py")
    assert partial_marker_len("text <", markers) == 1
    assert partial_marker_len("text <tool_call>", markers) == 0  # whole marker: not held
    assert partial_marker_len("a < b", markers) == 0


def test_flush_sends_what_a_buffered_parser_held():
    parser = Hermes2ProToolParser(hermes_tokenizer())
    request = make_request()
    # the call never closed: nothing went out while streaming
    text = ONE_CALL.removesuffix("\n</tool_call>")
    assert parser.extract_tool_calls_streaming("", text, text, [], [], [], request) is None
    delta = flush_tool_call_stream(parser, text, request)
    assert delta is not None and delta.content is None
    (call,) = delta.tool_calls
    assert (call.index, call.function.name, call.function.arguments) == (
        0,
        "final_answer",
        '{"trigger": true}',
    )
    assert flush_tool_call_stream(parser, text, request) is None  # nothing twice


class _UpstreamStyleParser(ToolParser):
    """A plugin written against upstream's base class: it tracks
    prev_tool_call_arr / streamed_args_for_tool and has no finish_streaming."""


def test_flush_falls_back_to_upstreams_unstreamed_arguments_check():
    parser = _UpstreamStyleParser(hermes_tokenizer())
    parser.prev_tool_call_arr = [
        {"name": "a", "arguments": {"x": 1}},
        {"name": "b", "arguments": {"q": "é"}},
    ]
    parser.streamed_args_for_tool = ['{"x": 1}', '{"q": "']
    delta = flush_tool_call_stream(parser, "", make_request())
    assert delta is not None
    assert [(c.index, c.function.arguments) for c in delta.tool_calls] == [(1, 'é"}')]
    assert parser.streamed_args_for_tool[1] == '{"q": "é"}'
    assert flush_tool_call_stream(parser, "", make_request()) is None
