"""Streaming equals non-streaming, for every built-in tool parser.

Each registered parser's fixture outputs are encoded with a real tokenizer of
its family and streamed one token per step, all at once, and in seeded random
multi-token steps (tests/tool_parsers/utils.py: run_streaming, which also
flushes at the finish as the server does). The streamed deltas must
reassemble to exactly extract_tool_calls' result: the same calls (name and
arguments text per index; ids aside), arguments that parse as JSON, and the
same content (None counted as ""), so no call text leaks into content.

Adding a parser: put one entry in STREAMING_CASES below,
    "name": [StreamingCase(tokenizer_factory, outputs), ...],
where `name` is the parser's registered name, `tokenizer_factory()` returns
a tokenizer of the family (e.g. tests.tool_parsers.utils.make_tokenizer(
special_tokens, outputs)), `outputs` are model outputs covering the parser's
cases (plain text, one call, several, after prose, malformed, unicode, ...),
and optionally `request=lambda: make_request(tools=[...])` when parsing
depends on the request's tools. Several cases per name are allowed (e.g. one
tokenizer with the markers as special tokens, one without).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest

from tests.tool_parsers import test_deepseekv3_tool_parser as deepseek
from tests.tool_parsers import test_granite_tool_parser as granite
from tests.tool_parsers import test_hermes_tool_parser as hermes
from tests.tool_parsers import test_llama3_json_tool_parser as llama
from tests.tool_parsers import test_mistral_tool_parser as mistral
from tests.tool_parsers import test_pythonic_tool_parser as pythonic
from tests.tool_parsers import test_qwen3coder_tool_parser as qwen3
from tests.tool_parsers.utils import (
    chunkings,
    embedded_tokenizer,
    make_request,
    run_nonstreaming,
    run_streaming,
)
from vllm.tool_parsers import ToolParserManager


@dataclass(frozen=True)
class StreamingCase:
    tokenizer: Callable[[], object]
    outputs: Sequence[str]
    request: Callable[[], object] = field(default=make_request)


STREAMING_CASES: dict[str, list[StreamingCase]] = {
    "hermes": [
        StreamingCase(hermes.hermes_tokenizer, hermes.HERMES_OUTPUTS),
        StreamingCase(embedded_tokenizer, hermes.HERMES_OUTPUTS),
    ],
    "llama3_json": [
        StreamingCase(llama.llama_tokenizer, llama.LLAMA_OUTPUTS),
        StreamingCase(embedded_tokenizer, llama.LLAMA_OUTPUTS),  # tag split over tokens
    ],
    "llama4_json": [StreamingCase(llama.llama_tokenizer, llama.LLAMA_OUTPUTS)],
    "granite": [
        StreamingCase(granite.granite_tokenizer, granite.GRANITE_OUTPUTS),
        StreamingCase(embedded_tokenizer, granite.GRANITE_OUTPUTS),
    ],
    "pythonic": [
        StreamingCase(pythonic.pythonic_tokenizer, pythonic.PYTHONIC_OUTPUTS),
        StreamingCase(embedded_tokenizer, pythonic.PYTHONIC_OUTPUTS),
    ],
    # mistral: the tokenizer decides the format ([ARGS] in the vocabulary: v11+)
    "mistral": [
        *(
            StreamingCase(functools.partial(mistral.family_tokenizer, markers), outputs)
            for markers, outputs in mistral.MISTRAL_STREAMING
        ),
        StreamingCase(embedded_tokenizer, mistral.MISTRAL_STREAMING[0][1]),  # pre-v11, as text
    ],
    "deepseek_v3": [
        StreamingCase(deepseek.tokenizer, deepseek.DEEPSEEK_OUTPUTS),
        StreamingCase(embedded_tokenizer, deepseek.DEEPSEEK_OUTPUTS),
    ],
    **{
        name: [
            StreamingCase(qwen3.tokenizer, qwen3.QWEN3_OUTPUTS, qwen3.qwen3_request),
            StreamingCase(embedded_tokenizer, qwen3.QWEN3_OUTPUTS, qwen3.qwen3_request),
        ]
        for name in ("qwen3_coder", "qwen3_xml")
    },
}


def _not_json(name: str):
    raise ValueError(f"{name} is not JSON")


def strict_json_loads(text: str):
    return json.loads(text, parse_constant=_not_json)


def _parser_class(name: str):
    try:
        return ToolParserManager.get_tool_parser(name)
    except ImportError:
        pytest.skip(f"tool parser {name!r} is registered but not implemented yet")


@pytest.mark.parametrize("name", ToolParserManager.list_registered())
def test_streaming_equals_nonstreaming(name: str):
    parser_cls = _parser_class(name)
    cases = STREAMING_CASES.get(name)
    assert cases, f"built-in tool parser {name!r} has no streaming fixtures here"
    for case in cases:
        tokenizer = case.tokenizer()
        for text in case.outputs:
            content, calls, _ = run_nonstreaming(parser_cls(tokenizer), text, case.request())
            for args in (a for _, a in calls):
                strict_json_loads(args)  # valid JSON (no NaN / Infinity)
            for chunks in chunkings():
                got = run_streaming(parser_cls(tokenizer), tokenizer, text, chunks, case.request())
                where = f"{name} {type(tokenizer).__name__} chunks={chunks[:8]} text={text!r}"
                assert got.call_tuples() == calls, where
                assert got.content == (content or ""), where
