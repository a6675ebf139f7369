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

import importlib
import importlib.util
import os
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.entrypoints.openai.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.protocol_responses import (
        DeltaMessage,
        ExtractedToolCallInformation,
    )
    from vllm.tokenizers.protocol import TokenizerLike

logger = init_logger(__name__)

_P = TypeVar("_P", bound=type["ToolParser"])


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


class ToolParserManager:
    """Name -> ToolParser class. Built-in parsers register lazily (module path
    and class name, imported on first use); plugins register eagerly with
    `@ToolParserManager.register_module("name")` in a file given to
    `--tool-parser-plugin`."""

    tool_parsers: dict[str, type[ToolParser]] = {}
    lazy_parsers: dict[str, tuple[str, str]] = {}

    @classmethod
    def get_tool_parser(cls, name: str) -> type[ToolParser]:
        if name in cls.tool_parsers:
            return cls.tool_parsers[name]
        if name in cls.lazy_parsers:
            module_path, class_name = cls.lazy_parsers[name]
            parser = getattr(importlib.import_module(module_path), class_name)
            cls.tool_parsers[name] = parser
            return parser
        raise KeyError(
            f"Tool parser {name!r} not found; available: {', '.join(cls.list_registered())}"
        )

    @classmethod
    def list_registered(cls) -> list[str]:
        return sorted(set(cls.tool_parsers) | set(cls.lazy_parsers))

    @classmethod
    def register_lazy_module(cls, name: str, module_path: str, class_name: str) -> None:
        cls.lazy_parsers[name] = (module_path, class_name)

    @classmethod
    def _register_module(
        cls, module: type[ToolParser], module_name: str | list[str] | None, force: bool
    ) -> None:
        if not (isinstance(module, type) and issubclass(module, ToolParser)):
            raise TypeError(f"tool parser must subclass ToolParser, got {module!r}")
        names = [module.__name__] if module_name is None else module_name
        for name in [names] if isinstance(names, str) else names:
            if not force and name in cls.tool_parsers:
                raise KeyError(f"{name!r} is already registered as {cls.tool_parsers[name]}")
            cls.tool_parsers[name] = module

    @classmethod
    def register_module(
        cls,
        name: str | list[str] | None = None,
        force: bool = True,
        module: type[ToolParser] | None = None,
    ) -> Callable[[_P], _P] | type[ToolParser]:
        """Register `module` under `name` (a decorator when `module` is None)."""
        if module is not None:
            cls._register_module(module, name, force)
            return module

        def decorator(parser: _P) -> _P:
            cls._register_module(parser, name, force)
            return parser

        return decorator

    @classmethod
    def import_tool_parser(cls, plugin_path: str) -> None:
        """Run a plugin file (`--tool-parser-plugin`), which registers its parsers."""
        module_name = os.path.splitext(os.path.basename(plugin_path))[0]
        spec = importlib.util.spec_from_file_location(module_name, plugin_path)
        if spec is None or spec.loader is None:
            raise ValueError(f"--tool-parser-plugin: cannot load {plugin_path!r}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
