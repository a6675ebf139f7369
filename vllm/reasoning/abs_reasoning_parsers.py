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

from abc import ABC, abstractmethod
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from vllm.utils.parser_registry import LazyParserRegistry

if TYPE_CHECKING:
    from vllm.entrypoints.openai.protocol_responses import DeltaMessage
    from vllm.tokenizers.protocol import TokenizerLike


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


class ReasoningParserManager(LazyParserRegistry):
    """Name -> ReasoningParser class (vllm/utils/parser_registry.py). Built-ins
    register lazily; plugins with `@ReasoningParserManager.register_module("name")`
    in a `--reasoning-parser-plugin` file."""

    reasoning_parsers: ClassVar[dict[str, type[ReasoningParser]]] = {}
    lazy_parsers: ClassVar[dict[str, tuple[str, str]]] = {}
    _classes = reasoning_parsers
    _kind = "Reasoning parser"
    _base = ReasoningParser
    _plugin_flag = "--reasoning-parser-plugin"

    @classmethod
    def get_reasoning_parser(cls, name: str) -> type[ReasoningParser]:
        parser: type[ReasoningParser] = cls._get(name)
        return parser

    @classmethod
    def import_reasoning_parser(cls, plugin_path: str) -> None:
        """Run a plugin file (`--reasoning-parser-plugin`), which registers its parsers."""
        cls._import_plugin(plugin_path)
