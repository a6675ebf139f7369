"""A chat choice's output as OpenAI fields: `reasoning`, `content`,
`tool_calls` (upstream: the parser branches of serving_chat.py).

Order, as upstream: the reasoning parser (`--reasoning-parser`) splits the
text into reasoning and content; tool calls are parsed from the content part
only, by the tool parser (`tool_choice: "auto"` with
`--enable-auto-tool-choice --tool-call-parser NAME`) or, for "required" and
named tools, by tool_choice.py ("required" is one more tool parser there).

Streaming (`ChoiceParser.stream_delta`, one instance per choice) feeds the
parsers' streaming entry points. When the choice finishes,
`ChoiceParser.finish` parses the whole text as the non-streamed response does
and sends what the streamed deltas still lack (text a parser held back while
a marker might have been forming, the tail of a call's arguments): the
streamed deltas reassemble to the non-streamed message. A parser that raises
is logged and its text is returned as content: never a 500.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm.entrypoints.openai import tool_choice
from vllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ToolCall,
)
from vllm.logger import init_logger
from vllm.reasoning import ReasoningParser, ReasoningParserManager
from vllm.tool_parsers import ToolParser, ToolParserManager
from vllm.tool_parsers.utils import flush_tool_call_stream

if TYPE_CHECKING:
    from vllm.tokenizers import TokenizerLike

logger = init_logger(__name__)


class ChatParsers:
    """The server's parser classes (looked up once, at start-up)."""

    def __init__(
        self,
        tool_parser: str | None = None,
        reasoning_parser: str | None = None,
        enable_auto_tools: bool = False,
    ) -> None:
        self.enable_auto_tools = enable_auto_tools
        self.tool_parser_cls: type[ToolParser] | None = (
            ToolParserManager.get_tool_parser(tool_parser) if tool_parser else None
        )
        self.reasoning_parser_cls: type[ReasoningParser] | None = (
            ReasoningParserManager.get_reasoning_parser(reasoning_parser)
            if reasoning_parser
            else None
        )

    def auto_tools(self, request: ChatCompletionRequest) -> bool:
        """Whether the tool parser reads this request's output ("auto", the
        default when tools are given)."""
        return (
            self.enable_auto_tools
            and self.tool_parser_cls is not None
            and bool(request.tools)
            and request.tool_choice in (None, "auto")
        )

    def adjust_request(
        self, request: ChatCompletionRequest, tokenizer: TokenizerLike
    ) -> ChatCompletionRequest:
        """The tool parser's changes to the request (e.g. keep the special
        tokens that mark a call), before it is rendered and sampled."""
        if not self.auto_tools(request):
            return request
        assert self.tool_parser_cls is not None
        return self.tool_parser_cls(tokenizer).adjust_request(request)

    def for_choice(
        self,
        request: ChatCompletionRequest,
        tokenizer: TokenizerLike,
        prompt_token_ids: Sequence[int] | None = None,
    ) -> ChoiceParser:
        """A fresh parser for one choice. As upstream (and as the engine, which
        then applies a grammar from the first token): when the prompt has
        already ended the reasoning (e.g. a template that closes an empty
        think block), the whole output is content."""
        reasoning = None
        if self.reasoning_parser_cls is not None:
            reasoning = self.reasoning_parser_cls(
                tokenizer, chat_template_kwargs=request.chat_template_kwargs or {}
            )
            if prompt_token_ids and _prompt_ends_reasoning(reasoning, prompt_token_ids):
                reasoning = None
        tools: ToolParser | None = None
        if request.tool_choice == "required" and request.tools:
            tools = tool_choice.RequiredToolParser(tokenizer)
        elif self.auto_tools(request):
            assert self.tool_parser_cls is not None
            tools = self.tool_parser_cls(tokenizer)
        return ChoiceParser(request, reasoning, tools)


def _prompt_ends_reasoning(parser: ReasoningParser, prompt_token_ids: Sequence[int]) -> bool:
    try:
        return parser.is_reasoning_end(prompt_token_ids)
    except Exception:
        logger.exception("Reasoning parser failed on the prompt")
        return False


@dataclass
class _Sent:
    """What the streamed deltas of one choice have carried so far."""

    content: str = ""
    reasoning: str = ""
    calls: dict[int, list[str]] = field(default_factory=dict)  # index -> [name, arguments]

    def record(self, delta: DeltaMessage) -> None:
        self.content += delta.content or ""
        self.reasoning += delta.reasoning or ""
        for call in delta.tool_calls:
            name, args = self.calls.setdefault(call.index, ["", ""])
            fn = call.function
            if fn is not None:
                self.calls[call.index] = [name + (fn.name or ""), args + (fn.arguments or "")]


class ChoiceParser:
    """Turns one choice's output into message fields, whole or streamed."""

    def __init__(
        self,
        request: ChatCompletionRequest,
        reasoning_parser: ReasoningParser | None,
        tool_parser: ToolParser | None,
    ) -> None:
        self.request = request
        self.reasoning_parser = reasoning_parser
        self.tool_parser = tool_parser
        self.forced = tool_choice.tool_call_stream(request)  # a named tool
        self.required = request.tool_choice == "required"
        # Streaming state: all text / ids so far, the content part of them.
        self._text = ""
        self._ids: list[int] = []
        self._content = ""
        self._content_ids: list[int] = []
        self._sent = _Sent()

    # ------------------------------------------------------------------
    # Whole output
    # ------------------------------------------------------------------

    def split_reasoning(self, text: str) -> tuple[str | None, str | None]:
        if self.reasoning_parser is None:
            return None, text
        try:
            return self.reasoning_parser.extract_reasoning(text, self.request)
        except Exception:
            logger.exception("Reasoning parser failed; the output is returned as content")
            return None, text

    def _extract_calls(self, content: str) -> tuple[list[ToolCall], str | None]:
        assert self.tool_parser is not None
        try:
            info = self.tool_parser.extract_tool_calls(content, self.request)
        except Exception:
            logger.exception("Tool parser failed; the output is returned as content")
            return [], content
        if info.tools_called:
            return list(info.tool_calls), info.content
        # As upstream: the parser may have cleaned the content up.
        return [], info.content if info.content else content

    def message(
        self, role: str, text: str, echo: str, engine_reason: str | None
    ) -> tuple[ChatMessage, str | None]:
        """The non-streamed message and finish_reason. `echo` (the echoed
        last message, or "") starts the content."""
        reasoning, content = self.split_reasoning(text)
        if self.request.include_reasoning is False:
            reasoning = None
        if self.forced is not None:
            message, reason = tool_choice.response_message(
                self.request, role, content or "", echo, engine_reason
            )
            message.reasoning = reasoning
            return message, reason
        calls: list[ToolCall] = []
        if self.tool_parser is not None:
            calls, content = self._extract_calls(content or "")
        if self.request.parallel_tool_calls is False:
            calls = calls[:1]  # as upstream: the calls after the first are dropped
        if echo or self.required:  # "required" calls come with content "" (upstream)
            content = echo + (content or "")
        message = ChatMessage(role=role, content=content, tool_calls=calls, reasoning=reasoning)
        if self.required:
            return message, tool_choice.finish_reason(self.request, engine_reason, bool(calls))
        return message, "tool_calls" if calls else engine_reason

    # ------------------------------------------------------------------
    # Streaming
    # ------------------------------------------------------------------

    def stream_delta(self, delta_text: str, delta_ids: Sequence[int]) -> DeltaMessage | None:
        """This step's delta (reasoning, content, tool-call pieces), or None."""
        prev_text, prev_ids = self._text, self._ids
        self._text, self._ids = prev_text + delta_text, [*prev_ids, *delta_ids]
        if self.reasoning_parser is None and self.tool_parser is None and self.forced is None:
            self._sent.content += delta_text
            return DeltaMessage(content=delta_text)  # plain text: every step is sent
        reasoning, content, content_ids = self._stream_reasoning(
            prev_text, prev_ids, delta_text, delta_ids
        )
        if self.request.include_reasoning is False:
            reasoning = None
        out = DeltaMessage(reasoning=reasoning or None)
        if content:
            out = merge_deltas(out, self._stream_content(content, content_ids))
        self._first_call_only(out)
        self._sent.record(out)
        return out if _carries(out) else None

    def _first_call_only(self, delta: DeltaMessage) -> None:
        """`parallel_tool_calls: false`: pieces of later calls are not sent."""
        if self.request.parallel_tool_calls is False:
            delta.tool_calls = [call for call in delta.tool_calls if call.index == 0]

    def _stream_reasoning(
        self, prev_text: str, prev_ids: list[int], delta_text: str, delta_ids: Sequence[int]
    ) -> tuple[str | None, str | None, list[int]]:
        parser = self.reasoning_parser
        if parser is None:
            return None, delta_text, list(delta_ids)
        try:
            delta = parser.extract_reasoning_streaming(
                prev_text, self._text, delta_text, prev_ids, self._ids, delta_ids
            )
        except Exception:
            logger.exception("Reasoning parser failed while streaming")
            return None, delta_text, list(delta_ids)
        if delta is None:
            return None, None, []
        ids = list(delta_ids)
        if delta.reasoning:  # the step ends the reasoning: only its tail is content
            try:
                ids = parser.extract_content_ids(ids)
            except Exception:
                ids = []
        return delta.reasoning, delta.content, ids

    def _stream_content(self, content: str, content_ids: list[int]) -> DeltaMessage:
        if self.forced is not None:
            return self.forced.delta(content) or DeltaMessage()
        if self.tool_parser is None:
            return DeltaMessage(content=content)
        prev, prev_ids = self._content, self._content_ids
        self._content, self._content_ids = prev + content, [*prev_ids, *content_ids]
        try:
            delta = self.tool_parser.extract_tool_calls_streaming(
                prev, self._content, content, prev_ids, self._content_ids, content_ids, self.request
            )
        except Exception:
            # What it held back is sent by finish() from the whole text.
            logger.exception("Tool parser failed while streaming")
            return DeltaMessage()
        return delta or DeltaMessage()

    def finish(self, role: str, engine_reason: str | None) -> tuple[DeltaMessage, str | None]:
        """The last delta of the choice (what the streamed ones still lack)
        and its finish_reason."""
        if self.forced is not None:
            # A named tool: the generated text is streamed as its arguments.
            called = self.forced.called
            return DeltaMessage(), tool_choice.finish_reason(self.request, engine_reason, called)
        flushed = self._flush()
        message, reason = self.message(role, self._text, "", engine_reason)
        rest = DeltaMessage(
            content=_rest(self._sent.content, message.content or "", "content"),
            reasoning=_rest(self._sent.reasoning, message.reasoning or "", "reasoning"),
            tool_calls=self._rest_calls(message.tool_calls),
        )
        self._sent.record(rest)
        if self._sent.calls and not self.required:
            reason = "tool_calls"
        return merge_deltas(flushed, rest), reason

    def _flush(self) -> DeltaMessage:
        """What the parsers held back, by their own end-of-stream calls: the
        reasoning parser's tail (its content part goes through the tool
        parser), then the tool parser's (tool_parsers/utils.py)."""
        out = DeltaMessage()
        try:
            if self.reasoning_parser is not None:
                tail = self.reasoning_parser.extract_reasoning_streaming_final(self._text)
                if tail is not None:
                    out = DeltaMessage(reasoning=tail.reasoning)
                    if tail.content:
                        out = merge_deltas(out, self._stream_content(tail.content, []))
            if self.tool_parser is not None:
                flushed = flush_tool_call_stream(self.tool_parser, self._content, self.request)
                out = merge_deltas(out, flushed or DeltaMessage())
        except Exception:
            logger.exception("A parser failed at the end of the stream")
        if self.request.include_reasoning is False:
            out.reasoning = None
        self._first_call_only(out)
        self._sent.record(out)
        return out

    def _rest_calls(self, calls: list[ToolCall]) -> list[DeltaToolCall]:
        out = []
        for index, call in enumerate(calls):
            sent = self._sent.calls.get(index)
            if sent is None:
                out.append(
                    DeltaToolCall(
                        id=call.id,
                        type="function",
                        index=index,
                        function=DeltaFunctionCall(
                            name=call.function.name, arguments=call.function.arguments
                        ),
                    )
                )
                continue
            rest = _rest(sent[1], call.function.arguments, f"tool call {index} arguments")
            if rest:
                out.append(DeltaToolCall(index=index, function=DeltaFunctionCall(arguments=rest)))
        return out


def _rest(sent: str, whole: str, what: str) -> str | None:
    """What `whole` adds to the streamed `sent` (None when nothing)."""
    if whole.startswith(sent):
        return whole[len(sent) :] or None
    logger.warning("Streamed %s differ from the parsed output: %r vs %r", what, sent, whole)
    return None


def _carries(delta: DeltaMessage) -> bool:
    return bool(delta.content or delta.reasoning or delta.tool_calls)


def merge_deltas(first: DeltaMessage, second: DeltaMessage) -> DeltaMessage:
    """One delta carrying both (text concatenated; tool-call pieces of the
    same index joined, so a chunk has one entry per call)."""
    calls: dict[int, DeltaToolCall] = {}
    for call in [*first.tool_calls, *second.tool_calls]:
        if call.index not in calls:
            calls[call.index] = call.model_copy(deep=True)
            continue
        into = calls[call.index]
        into.id = into.id or call.id
        into.type = into.type or call.type
        if call.function is not None:
            fn = into.function or DeltaFunctionCall()
            fn.name = _join(fn.name, call.function.name)
            fn.arguments = _join(fn.arguments, call.function.arguments)
            into.function = fn
    return DeltaMessage(
        role=first.role or second.role,
        content=_join(first.content, second.content),
        reasoning=_join(first.reasoning, second.reasoning),
        tool_calls=list(calls.values()),
    )


def _join(a: str | None, b: str | None) -> str | None:
    return b if a is None else a if b is None else a + b
