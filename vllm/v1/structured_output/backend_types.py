"""The interface between the structured output manager and a grammar backend
(upstream: vllm/v1/structured_output/backend_types.py)."""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from vllm.config import VllmConfig
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.tokenizers import TokenizerLike


class StructuredOutputOptions(enum.Enum):
    """The kind of a constraint (one per StructuredOutputsParams field)."""

    JSON = enum.auto()
    JSON_OBJECT = enum.auto()
    REGEX = enum.auto()
    GRAMMAR = enum.auto()
    CHOICE = enum.auto()
    STRUCTURAL_TAG = enum.auto()


# What identifies a compiled grammar: its kind and its spec as text.
StructuredOutputKey = tuple[StructuredOutputOptions, str]


class StructuredOutputGrammar(ABC):
    """The matcher state of one request: which tokens may come next."""

    @abstractmethod
    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        """Advance by `tokens`; False (state unchanged past the first
        rejected token) when the grammar rejects one."""

    @abstractmethod
    def validate_tokens(self, tokens: list[int]) -> list[int]:
        """The longest prefix of `tokens` the grammar accepts, without
        advancing the state."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens."""

    @abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, idx: int) -> None:
        """Write the allowed next tokens into row `idx` of `bitmask`."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """Whether the grammar has accepted a stop token (the output is done)."""

    @abstractmethod
    def reset(self) -> None:
        """Back to the start state."""


@dataclass
class StructuredOutputBackend(ABC):
    """Compiles constraints into grammars for one tokenizer."""

    vllm_config: VllmConfig
    tokenizer: TokenizerLike
    # The model's logits width: the bitmask's vocabulary.
    vocab_size: int

    @abstractmethod
    def compile_grammar(
        self,
        request_type: StructuredOutputOptions,
        grammar_spec: str,
        *,
        params: StructuredOutputsParams | None = None,
    ) -> StructuredOutputGrammar:
        """A fresh matcher for the constraint (ValueError when it does not
        compile). `params` carries the request's formatting options
        (whitespace, additional properties)."""

    @abstractmethod
    def allocate_token_bitmask(self, max_num_seqs: int) -> torch.Tensor:
        """An int32 [max_num_seqs, ceil(vocab_size / 32)] bitmask buffer."""

    @abstractmethod
    def destroy(self) -> None:
        """Free the backend's resources (compiled-grammar cache, threads)."""
