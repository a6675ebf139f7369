"""A `--tool-parser-plugin` file for the tests: registers the tool parser
"marker_call", which reads `CALL <name> <json arguments>` lines.

Its streaming entry point sends the text before the first `CALL` as content
and holds everything from it on back (returns None): the server sends the
calls when the choice finishes (chat_parsing.ChoiceParser.finish), and the
streamed deltas still reassemble to the non-streamed message.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from vllm.entrypoints.openai.protocol import (
    DeltaMessage,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
)
from vllm.tool_parsers import ToolParser, ToolParserManager

MARKER = "CALL "


@ToolParserManager.register_module("marker_call")
class MarkerToolParser(ToolParser):
    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.content_sent = 0  # characters of content streamed so far

    def extract_tool_calls(self, model_output: str, request: Any) -> ExtractedToolCallInformation:
        if model_output.startswith("RAISE"):
            raise RuntimeError("a parser bug")
        head, sep, rest = model_output.partition(MARKER)
        if not sep:
            return ExtractedToolCallInformation(
                tools_called=False, tool_calls=[], content=model_output
            )
        calls = []
        for line in (MARKER + rest).splitlines():
            name, _, arguments = line.removeprefix(MARKER).partition(" ")
            try:
                json.loads(arguments)
            except ValueError:  # a broken call: all of it is content
                return ExtractedToolCallInformation(
                    tools_called=False, tool_calls=[], content=model_output
                )
            calls.append(ToolCall(function=FunctionCall(name=name, arguments=arguments)))
        return ExtractedToolCallInformation(
            tools_called=True, tool_calls=calls, content=head or None
        )

    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request: Any,
    ) -> DeltaMessage | None:
        maybe_marker = any(current_text.endswith(MARKER[:n]) for n in range(1, len(MARKER)))
        if MARKER in current_text or maybe_marker:
            return None  # a call, or maybe the start of one: held back
        sent, self.content_sent = self.content_sent, len(current_text)
        return DeltaMessage(content=current_text[sent:])
