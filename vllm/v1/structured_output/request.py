"""The structured-output state of one request (upstream:
vllm/v1/structured_output/request.py)."""

from __future__ import annotations

import json
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from vllm.sampling_params import SamplingParams, StructuredOutputsParams
from vllm.v1.structured_output.backend_types import (
    StructuredOutputGrammar,
    StructuredOutputKey,
    StructuredOutputOptions,
)

if TYPE_CHECKING:
    from vllm.reasoning import ReasoningParser


@dataclass
class StructuredOutputRequest:
    """A request's constraint, and its grammar once compiled.

    The manager sets `grammar` to a Future while compiling in its thread
    pool; `is_grammar_ready` polls it without blocking. A failed compilation
    leaves `grammar` None and records the message in `compile_error`: it is
    never raised into the engine loop.
    """

    params: StructuredOutputsParams
    _grammar: Future[StructuredOutputGrammar] | StructuredOutputGrammar | None = None
    compile_error: str | None = None
    # With a reasoning parser: whether the reasoning has ended (the grammar
    # applies only after it). None until the manager asks the parser about
    # the prompt; the front end may set it (EngineCoreRequest.reasoning_ended).
    reasoning_ended: bool | None = field(default=None)
    # The kwargs this request's own parser is built with (e.g.
    # {"chat_template_kwargs": {"enable_thinking": False}}), and that parser
    # once built; without kwargs the manager's shared parser serves.
    reasoning_parser_kwargs: dict[str, Any] | None = None
    reasoner: ReasoningParser | None = None

    @property
    def is_grammar_ready(self) -> bool:
        """Whether compilation has finished (successfully or not); non-blocking."""
        if isinstance(self._grammar, Future):
            if not self._grammar.done():
                return False
            self._resolve()
        return self._grammar is not None or self.compile_error is not None

    @property
    def grammar(self) -> StructuredOutputGrammar | None:
        """The compiled grammar; None while compiling or after a failure."""
        if isinstance(self._grammar, Future):
            if not self._grammar.done():
                return None
            self._resolve()
        assert not isinstance(self._grammar, Future)
        return self._grammar

    @grammar.setter
    def grammar(
        self, grammar: Future[StructuredOutputGrammar] | StructuredOutputGrammar | None
    ) -> None:
        self._grammar = grammar

    def _resolve(self) -> None:
        """Turn the finished future into the grammar or a compile_error."""
        assert isinstance(self._grammar, Future) and self._grammar.done()
        future, self._grammar = self._grammar, None
        if future.cancelled():  # the manager shut down (clear_backend)
            self.compile_error = "grammar compilation was cancelled"
            return
        exc = future.exception()
        if exc is None:
            self._grammar = future.result()
        else:
            self.compile_error = f"{type(exc).__name__}: {exc}"

    @staticmethod
    def from_sampling_params(
        sampling_params: SamplingParams | None,
    ) -> StructuredOutputRequest | None:
        """The request's structured output state, or None without a constraint."""
        if sampling_params is None or sampling_params.structured_outputs is None:
            return None
        return StructuredOutputRequest(sampling_params.structured_outputs)

    @cached_property
    def structured_output_key(self) -> StructuredOutputKey:
        return get_structured_output_key(self.params)


def get_structured_output_key(params: StructuredOutputsParams) -> StructuredOutputKey:
    """(kind, spec text) of the constraint: the compile-cache key."""
    if params.json is not None:
        return StructuredOutputOptions.JSON, params.json_str or ""
    if params.json_object:
        return StructuredOutputOptions.JSON_OBJECT, ""
    if params.regex is not None:
        return StructuredOutputOptions.REGEX, params.regex
    if params.choice:
        return StructuredOutputOptions.CHOICE, json.dumps(params.choice)
    if params.grammar is not None:
        return StructuredOutputOptions.GRAMMAR, params.grammar
    if params.structural_tag is not None:
        return StructuredOutputOptions.STRUCTURAL_TAG, params.structural_tag
    raise ValueError("No valid structured output parameter found")
