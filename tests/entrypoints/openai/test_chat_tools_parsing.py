"""The chat output path in process (no server): parser plugins, the
reasoning -> tool-call order, stream == non-stream at every token boundary,
parser failures as content, start-up checks of the parser flags, and tool
history through the chat template. Real tokenizer: the embedded SmolLM2."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from vllm.entrypoints.chat_utils import apply_hf_chat_template
from vllm.entrypoints.openai.chat_parsing import ChatParsers
from vllm.entrypoints.openai.cli_args import validate_parser_args
from vllm.entrypoints.openai.protocol import ChatCompletionRequest
from vllm.reasoning import ReasoningParserManager
from vllm.tool_parsers import ToolParserManager

PLUGINS = Path(__file__).parent / "plugins"
TOOL_PLUGIN = str(PLUGINS / "marker_tool_parser.py")
REASONING_PLUGIN = str(PLUGINS / "marker_reasoning_parser.py")
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _args(**kw: Any) -> argparse.Namespace:
    base = dict(
        enable_auto_tool_choice=False,
        tool_call_parser=None,
        tool_parser_plugin="",
        reasoning_parser=None,
        reasoning_parser_plugin="",
    )
    return argparse.Namespace(**{**base, **kw})


@pytest.fixture(scope="module")
def plugins():
    validate_parser_args(
        _args(tool_parser_plugin=TOOL_PLUGIN, reasoning_parser_plugin=REASONING_PLUGIN)
    )


@pytest.fixture(scope="module")
def tokenizer(embedded_model_path):
    from vllm.transformers_utils.tokenizer import get_tokenizer

    return get_tokenizer(embedded_model_path)


def _request(**kw: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER], **kw}
    )


def _streamed(parser: Any, tokenizer: Any, text: str, chunk: int = 1) -> dict[str, Any]:
    """Feed `text` token by token (`chunk` tokens a step, as the engine's
    detokenizer would) and reassemble the deltas."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    out: dict[str, Any] = {"content": "", "reasoning": "", "calls": {}}
    sent = ""
    for start in range(0, len(ids), chunk):
        step = ids[start : start + chunk]
        now = tokenizer.decode(ids[: start + len(step)])
        if now.endswith("\ufffd"):  # half a character: the detokenizer waits
            now = sent
        deltas = [parser.stream_delta(now[len(sent) :], step)]
        sent = now
        reason = None
        if start + chunk >= len(ids):
            last, reason = parser.finish("assistant", "stop")
            deltas.append(last)
        for delta in filter(None, deltas):
            out["content"] += delta.content or ""
            out["reasoning"] += delta.reasoning or ""
            for call in delta.tool_calls:
                name, args = out["calls"].get(call.index, ("", ""))
                fn = call.function
                out["calls"][call.index] = (name + (fn.name or ""), args + (fn.arguments or ""))
    out["finish_reason"] = reason
    return out


def _whole(parser: Any, text: str) -> dict[str, Any]:
    message, reason = parser.message("assistant", text, "", "stop")
    return {
        "content": message.content or "",
        "reasoning": message.reasoning or "",
        "calls": {
            i: (c.function.name, c.function.arguments) for i, c in enumerate(message.tool_calls)
        },
        "finish_reason": reason,
    }


CASES = {
    "plain": ("It is sunny in Paris.", "It is sunny in Paris.", []),
    "call after prose": (
        'Let me check. CALL get_weather {"city": "Paris"}',
        "Let me check. ",
        [("get_weather", '{"city": "Paris"}')],
    ),
    "two calls, unicode": (
        'CALL get_weather {"city": "Zürich"}\nCALL get_weather {"city": "東京"}',
        None,
        [("get_weather", '{"city": "Zürich"}'), ("get_weather", '{"city": "東京"}')],
    ),
    "broken call is content": ('CALL get_weather {"city": ', 'CALL get_weather {"city": ', []),
    "parser that raises": ("RAISE CALL x {}", "RAISE CALL x {}", []),
}


@pytest.mark.parametrize("text,content,calls", CASES.values(), ids=list(CASES))
def test_tool_parser_plugin(plugins, tokenizer, text, content, calls):
    """--tool-parser-plugin registers "marker_call"; "auto" parses with it,
    streamed (any split) == non-streamed, finish_reason "tool_calls" iff calls."""
    parsers = ChatParsers("marker_call", None, enable_auto_tools=True)
    request = _request()
    whole = _whole(parsers.for_choice(request, tokenizer), text)
    assert whole["content"] == (content or "")
    assert list(whole["calls"].values()) == calls
    assert whole["finish_reason"] == ("tool_calls" if calls else "stop")
    for _, arguments in calls:
        json.loads(arguments)
    for chunk in (1, 2, 5):
        assert _streamed(parsers.for_choice(request, tokenizer), tokenizer, text, chunk) == whole


def test_tool_choice_none_and_no_flag_do_not_parse(plugins, tokenizer):
    text = 'CALL get_weather {"city": "Paris"}'
    for parsers, request in (
        (ChatParsers("marker_call", None, enable_auto_tools=True), _request(tool_choice="none")),
        (ChatParsers("marker_call", None, enable_auto_tools=False), _request(tool_choice="none")),
        (ChatParsers("marker_call", None, enable_auto_tools=True), _request(tools=None)),
    ):
        message, reason = parsers.for_choice(request, tokenizer).message(
            "assistant", text, "", "stop"
        )
        assert (message.content, message.tool_calls, reason) == (text, [], "stop")


REASONING_CASES = {
    "reasoning then a call": (
        'The user wants weather. => CALL get_weather {"city": "Oslo"}',
        "The user wants weather. ",
        " ",
        [("get_weather", '{"city": "Oslo"}')],
    ),
    # A call inside the reasoning is not a call: calls come from the content only.
    "call text inside reasoning": (
        'maybe CALL get_weather {"city": "Oslo"} => Oslo is cold.',
        'maybe CALL get_weather {"city": "Oslo"} ',
        " Oslo is cold.",
        [],
    ),
    "cut off while thinking": ("still thinking = about it", "still thinking = about it", None, []),
}


@pytest.mark.parametrize(
    "text,reasoning,content,calls", REASONING_CASES.values(), ids=list(REASONING_CASES)
)
def test_reasoning_parser_plugin(plugins, tokenizer, text, reasoning, content, calls):
    """--reasoning-parser-plugin registers "marker_think"; the reasoning is
    split off first and tool calls are parsed from the content part only."""
    parsers = ChatParsers("marker_call", "marker_think", enable_auto_tools=True)
    request = _request()
    whole = _whole(parsers.for_choice(request, tokenizer), text)
    assert whole["reasoning"] == reasoning
    assert whole["content"] == (content or "")
    assert list(whole["calls"].values()) == calls
    for chunk in (1, 3):
        assert _streamed(parsers.for_choice(request, tokenizer), tokenizer, text, chunk) == whole
    no_reasoning = parsers.for_choice(_request(include_reasoning=False), tokenizer)
    assert _whole(no_reasoning, text)["reasoning"] == ""


def test_enable_thinking_false_reaches_the_reasoning_parser(plugins, tokenizer):
    parsers = ChatParsers(None, "marker_think")
    request = _request(tools=None, chat_template_kwargs={"enable_thinking": False})
    message, _ = parsers.for_choice(request, tokenizer).message("assistant", "a => b", "", "stop")
    assert (message.reasoning, message.content) == (None, "a => b")


@pytest.mark.parametrize(
    "kw,message",
    [
        (
            dict(enable_auto_tool_choice=True),
            "--enable-auto-tool-choice requires --tool-call-parser",
        ),
        (dict(enable_auto_tool_choice=True, tool_call_parser="nope"), "hermes"),
        (dict(tool_call_parser="nope"), "invalid tool call parser: nope"),
        (dict(reasoning_parser="nope"), "deepseek_r1"),
        (dict(tool_parser_plugin="/no/such/plugin.py"), "/no/such/plugin.py"),
    ],
)
def test_parser_flags_are_checked_at_start_up(kw, message):
    with pytest.raises(ValueError, match=message):
        validate_parser_args(_args(**kw))


def test_builtin_parser_names_are_registered():
    assert {
        "hermes",
        "llama3_json",
        "mistral",
        "pythonic",
        "qwen3_xml",
        "deepseek_v3",
        "granite",
    } <= set(ToolParserManager.list_registered())
    assert {"deepseek_r1", "qwen3", "granite", "mistral"} <= set(
        ReasoningParserManager.list_registered()
    )


# ----------------------------------------------------------------------
# Tool history through the chat template
# ----------------------------------------------------------------------

HISTORY_TEMPLATE = (
    "{% for m in messages %}[{{ m.role }}]"
    "{% if m.reasoning_content %}(thought: {{ m.reasoning_content }}){% endif %}"
    "{% for c in m.tool_calls or [] %}"
    "call {{ c.function.name }} city={{ c.function.arguments.city }};{% endfor %}"
    "{% if m.tool_call_id %}<{{ m.tool_call_id }}>{% endif %}{{ m.content }}\n{% endfor %}"
)
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "reasoning": "Use the tool.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]


def test_tool_history_reaches_the_template(tokenizer):
    """As upstream: a call's JSON arguments reach the template as a dict, an
    assistant turn without content renders "", reasoning under both names."""
    messages = [
        ChatCompletionRequest.model_validate({"messages": HISTORY})
        .messages[i]
        .model_dump(exclude_none=True)
        for i in range(len(HISTORY))
    ]
    text = apply_hf_chat_template(
        tokenizer, messages, HISTORY_TEMPLATE, None, add_generation_prompt=False
    )
    assert text == (
        "[user]Weather in Paris?\n"
        "[assistant](thought: Use the tool.)call get_weather city=Paris;\n"
        "[tool]<call_1>sunny\n"
    )


def test_tool_history_with_arguments_that_are_not_json(tokenizer):
    bad = json.loads(json.dumps(HISTORY))
    bad[1]["tool_calls"][0]["function"]["arguments"] = "{city: Paris"
    with pytest.raises(ValueError, match="not valid JSON"):
        apply_hf_chat_template(tokenizer, bad, HISTORY_TEMPLATE, None)


BUILTIN_TEXTS = [
    (
        'Let me think.</think>Sure.<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call>'
    ),
    (
        '<think>Hmm <tool_call>{"name": "x", "arguments": {}}</tool_call></think>'
        'Two: <tool_call>{"name": "get_weather", "arguments": {"city": "Zürich"}}</tool_call>'
        '<tool_call>{"name": "get_weather", "arguments": {"city": "東京"}}</tool_call>'
    ),
    'Thinking.</think><tool_call>{"name": "get_weather", "arguments": {"city": ',
    "Cut off while thinking </thi",
]


@pytest.mark.parametrize("text", BUILTIN_TEXTS)
@pytest.mark.parametrize("chunk", [1, 3])
def test_hermes_after_qwen3_streamed_equals_non_streamed(tokenizer, text, chunk):
    """The built-in parsers on the serving path (SmolLM2 spells the markers
    in pieces): reasoning first, calls only from the content, any split."""
    parsers = ChatParsers("hermes", "qwen3", enable_auto_tools=True)
    request = _request()
    whole = _whole(parsers.for_choice(request, tokenizer), text)
    assert _streamed(parsers.for_choice(request, tokenizer), tokenizer, text, chunk) == whole
    for _, arguments in whole["calls"].values():
        json.loads(arguments)
    assert "<tool_call>" not in whole["content"] or not whole["calls"]


def test_hermes_after_qwen3_splits_as_expected(tokenizer):
    parsers = ChatParsers("hermes", "qwen3", enable_auto_tools=True)
    whole = _whole(parsers.for_choice(_request(), tokenizer), BUILTIN_TEXTS[1])
    assert whole["reasoning"].startswith("Hmm <tool_call>")  # not a call: it is reasoning
    assert [json.loads(a)["city"] for _, a in whole["calls"].values()] == ["Zürich", "東京"]
    assert whole["content"].strip() == "Two:" and whole["finish_reason"] == "tool_calls"
    broken = _whole(parsers.for_choice(_request(), tokenizer), BUILTIN_TEXTS[2])
    assert broken["calls"] == {} and "<tool_call>" in broken["content"]


def test_prompt_that_ended_the_reasoning_makes_the_output_content(tokenizer):
    """As upstream and the engine's grammar gate: when the prompt already
    closed the reasoning, the output is all content (a grammar applied from
    the first token, so JSON never lands in `reasoning`)."""
    parsers = ChatParsers(None, "deepseek_r1")
    request = _request(tools=None)
    output = '{"answer": 6}'
    closed = tokenizer.encode("<think>\n\n</think>\n\n", add_special_tokens=False)
    message, _ = parsers.for_choice(request, tokenizer, closed).message(
        "assistant", output, "", "stop"
    )
    assert (message.reasoning, message.content) == (None, output)
    open_ = tokenizer.encode("Answer.<think>", add_special_tokens=False)
    message, _ = parsers.for_choice(request, tokenizer, open_).message(
        "assistant", output, "", "stop"
    )
    assert (message.reasoning, message.content) == (output, None)  # cut off while thinking


@pytest.mark.parametrize("chunk", [1, 4])
def test_parallel_tool_calls_false_keeps_the_first_call(tokenizer, chunk):
    """As upstream (vllm#26233): the calls after the first are dropped,
    streamed and not."""
    parsers = ChatParsers("hermes", None, enable_auto_tools=True)
    request = _request(parallel_tool_calls=False)
    text = BUILTIN_TEXTS[1].split("</think>", 1)[1]  # two calls after "Two: "
    whole = _whole(parsers.for_choice(request, tokenizer), text)
    assert [json.loads(a)["city"] for _, a in whole["calls"].values()] == ["Zürich"]
    assert whole["finish_reason"] == "tool_calls"
    assert _streamed(parsers.for_choice(request, tokenizer), tokenizer, text, chunk) == whole
