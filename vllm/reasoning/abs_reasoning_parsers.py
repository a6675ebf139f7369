"""The reasoning-parser contract and its registry.

Upstream: vllm/reasoning/abs_reasoning_parsers.py.

A `ReasoningParser` splits a thinking model's output into `reasoning` (the
part between the model's think markers) and `content` (the answer), for
`--reasoning-parser NAME` on the server. One instance serves one request.

It is also what the structured-output manager asks when the grammar may start
(`is_reasoning_end`): a grammar constrains only the content, so the tokens of
the reasoning are sampled freely, and the bitmask applies from the first token
after the end marker. With `chat_template_kwargs: {"enable_thinking": false}`
there is no reasoning: the parser is built with that kwarg and reports the
reasoning as ended from the first token.

The two text entry points must agree (tests/reasoning checks it at every
token boundary): concatenating the streamed `reasoning` / `content` deltas
gives exactly `extract_reasoning`'s pair.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from vllm.entrypoints.openai.protocol_responses import DeltaMessage
    from vllm.tokenizers.protocol import TokenizerLike

_P = TypeVar("_P", bound=type["ReasoningParser"])


class ReasoningParser(ABC):
    """Base of every reasoning parser."""

    def __init__(self, tokenizer: TokenizerLike, *args: Any, **kwargs: Any) -> None:
        # kwargs: upstream passes `chat_template_kwargs` (enable_thinking, ...).
        self.model_tokenizer = tokenizer

    @cached_property
    def vocab(self) -> dict[str, int]:
        return self.model_tokenizer.get_vocab()

    @abstractmethod
    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        """Whether the reasoning has ended within `input_ids` (the output so far)."""

    def is_reasoning_end_streaming(
        self, input_ids: Sequence[int], delta_ids: Sequence[int]
    ) -> bool:
        """As `is_reasoning_end`, given the ids just added (a parser may look
        only at those)."""
        return self.is_reasoning_end(input_ids)

    @abstractmethod
    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        """The ids of the content part (after the reasoning) of `input_ids`."""

    @abstractmethod
    def extract_reasoning(self, model_output: str, request: Any) -> tuple[str | None, str | None]:
        """The whole output -> (reasoning, content); either may be None."""

    @abstractmethod
    def extract_reasoning_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
    ) -> DeltaMessage | None:
        """The DeltaMessage (reasoning and/or content) for this step, or None."""

    def extract_reasoning_streaming_final(self, model_output: str) -> DeltaMessage | None:
        """The text a stream still holds back once the output is complete
        (`model_output`: all of it), or None.

        A parser that matches its markers in text holds back, while
        streaming, a tail that may be the start of a marker ("</thi" at the
        end of a delta); when the stream ends there, that tail is released
        here. The serving layer calls it once, after the last
        `extract_reasoning_streaming` of a choice. Not in upstream, whose
        parsers detect markers by token id only.
        """
        return None


class ReasoningParserManager:
    """Name -> ReasoningParser class; built-ins register lazily, plugins with
    `@ReasoningParserManager.register_module("name")` in a
    `--reasoning-parser-plugin` file."""

    reasoning_parsers: dict[str, type[ReasoningParser]] = {}
    lazy_parsers: dict[str, tuple[str, str]] = {}

    @classmethod
    def get_reasoning_parser(cls, name: str) -> type[ReasoningParser]:
        if name in cls.reasoning_parsers:
            return cls.reasoning_parsers[name]
        if name in cls.lazy_parsers:
            module_path, class_name = cls.lazy_parsers[name]
            parser = getattr(importlib.import_module(module_path), class_name)
            cls.reasoning_parsers[name] = parser
            return parser
        raise KeyError(
            f"Reasoning parser {name!r} not found; available: {', '.join(cls.list_registered())}"
        )

    @classmethod
    def list_registered(cls) -> list[str]:
        return sorted(set(cls.reasoning_parsers) | set(cls.lazy_parsers))

    @classmethod
    def register_lazy_module(cls, name: str, module_path: str, class_name: str) -> None:
        cls.lazy_parsers[name] = (module_path, class_name)

    @classmethod
    def _register_module(
        cls, module: type[ReasoningParser], module_name: str | list[str] | None, force: bool
    ) -> None:
        if not (isinstance(module, type) and issubclass(module, ReasoningParser)):
            raise TypeError(f"reasoning parser must subclass ReasoningParser, got {module!r}")
        names = [module.__name__] if module_name is None else module_name
        for name in [names] if isinstance(names, str) else names:
            if not force and name in cls.reasoning_parsers:
                raise KeyError(f"{name!r} is already registered as {cls.reasoning_parsers[name]}")
            cls.reasoning_parsers[name] = module

    @classmethod
    def register_module(
        cls,
        name: str | list[str] | None = None,
        force: bool = True,
        module: type[ReasoningParser] | None = None,
    ) -> Callable[[_P], _P] | type[ReasoningParser]:
        """Register `module` under `name` (a decorator when `module` is None)."""
        if module is not None:
            cls._register_module(module, name, force)
            return module

        def decorator(parser: _P) -> _P:
            cls._register_module(parser, name, force)
            return parser

        return decorator

    @classmethod
    def import_reasoning_parser(cls, plugin_path: str) -> None:
        """Run a plugin file (`--reasoning-parser-plugin`), which registers its parsers."""
        module_name = os.path.splitext(os.path.basename(plugin_path))[0]
        spec = importlib.util.spec_from_file_location(module_name, plugin_path)
        if spec is None or spec.loader is None:
            raise ValueError(f"--reasoning-parser-plugin: cannot load {plugin_path!r}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
