"""The tool-parser contract and its registry (upstream: vllm/tool_parsers/abstract_tool_parser.py).

A `ToolParser` turns a model's text into OpenAI `tool_calls` for
`tool_choice: "auto"` (`--enable-auto-tool-choice --tool-call-parser NAME`).
One parser instance serves one request (and one choice): the streaming state
below lives on the instance.

Two entry points, which must agree (tests/tool_parsers checks it by splitting
every fixture at every token boundary):
  extract_tool_calls(model_output, request)
      the whole output at once -> ExtractedToolCallInformation
      (tools_called, tool_calls, content: the text outside the calls, or None).
  extract_tool_calls_streaming(previous_text, current_text, delta_text,
                               previous_token_ids, current_token_ids,
                               delta_token_ids, request)
      called once per engine output with the text so far; returns the
      DeltaMessage to send for this step (content and/or tool_calls deltas), or
      None to send nothing yet (e.g. while a call's start marker might still be
      forming). Concatenating every returned `content` gives the non-streamed
      content; per call index, the first DeltaToolCall carries id, type and
      function.name, later ones append to function.arguments, and the
      concatenated arguments equal the non-streamed arguments exactly.
Text that looks like a call but does not parse is content, never an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from vllm.logger import init_logger
from vllm.utils.parser_registry import LazyParserRegistry

if TYPE_CHECKING:
    from vllm.entrypoints.openai.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.protocol_responses import (
        DeltaMessage,
        ExtractedToolCallInformation,
    )
    from vllm.tokenizers.protocol import TokenizerLike

logger = init_logger(__name__)


class ToolParser:
    """Base of every tool parser; subclasses implement the two extract methods."""

    def __init__(self, tokenizer: TokenizerLike) -> None:
        # Streaming state, upstream's names (several parsers and upstream's
        # serving code read them): the calls parsed so far, as dicts with
        # "name" and "arguments"; the index of the call being streamed (-1:
        # none yet); whether its name has been sent; the arguments text sent
        # so far for each call.
        self.prev_tool_call_arr: list[dict[str, Any]] = []
        self.current_tool_id: int = -1
        self.current_tool_name_sent: bool = False
        self.streamed_args_for_tool: list[str] = []
        self.model_tokenizer = tokenizer

    @cached_property
    def vocab(self) -> dict[str, int]:
        return self.model_tokenizer.get_vocab()

    def adjust_request(self, request: ChatCompletionRequest) -> ChatCompletionRequest:
        """Change the request before it is rendered and sampled (e.g. keep the
        special tokens that mark a call in the detokenized text). Default: as is."""
        return request

    def extract_tool_calls(
        self, model_output: str, request: ChatCompletionRequest
    ) -> ExtractedToolCallInformation:
        raise NotImplementedError(f"{type(self).__name__} does not implement extract_tool_calls")

    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request: ChatCompletionRequest,
    ) -> DeltaMessage | None:
        raise NotImplementedError(
            f"{type(self).__name__} does not implement extract_tool_calls_streaming"
        )


class ToolParserManager(LazyParserRegistry):
    """Name -> ToolParser class (vllm/utils/parser_registry.py). Built-ins
    register lazily; plugins with `@ToolParserManager.register_module("name")`
    in a file given to `--tool-parser-plugin`."""

    tool_parsers: ClassVar[dict[str, type[ToolParser]]] = {}
    lazy_parsers: ClassVar[dict[str, tuple[str, str]]] = {}
    _classes = tool_parsers
    _kind = "Tool parser"
    _base = ToolParser
    _plugin_flag = "--tool-parser-plugin"

    @classmethod
    def get_tool_parser(cls, name: str) -> type[ToolParser]:
        parser: type[ToolParser] = cls._get(name)
        return parser

    @classmethod
    def import_tool_parser(cls, plugin_path: str) -> None:
        """Run a plugin file (`--tool-parser-plugin`), which registers its parsers."""
        cls._import_plugin(plugin_path)
