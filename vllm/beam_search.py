"""Beam search bookkeeping for `LLM.beam_search` (upstream: vllm/beam_search.py).

Beam search runs on top of ordinary generation: every step, each live beam is
submitted as a prompt (its tokens so far) for one token with
`logprobs = 2 * beam_width`, and its candidates are the returned top tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm.logprobs import Logprob

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest


@dataclass
class BeamSearchSequence:
    """One beam: prompt + generated tokens, the logprob dict of each generated
    position and the sum of the chosen tokens' logprobs. `text` (the decoded
    tokens, prompt included) is filled in when the beam is returned."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]]
    lora_request: LoRARequest | None = None
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class BeamSearchOutput:
    """The best `beam_width` sequences of one prompt, best first."""

    sequences: list[BeamSearchSequence]


@dataclass
class BeamSearchInstance:
    """The live beams and the finished (EOS) sequences of one prompt."""

    beams: list[BeamSearchSequence]
    completed: list[BeamSearchSequence] = field(default_factory=list)

    @classmethod
    def from_prompt(
        cls, prompt_tokens: list[int], lora_request: LoRARequest | None = None
    ) -> BeamSearchInstance:
        return cls(
            beams=[
                BeamSearchSequence(
                    tokens=list(prompt_tokens), logprobs=[], lora_request=lora_request
                )
            ]
        )


def get_beam_search_score(
    tokens: list[int],
    cumulative_logprob: float,
    eos_token_id: int | None,
    length_penalty: float = 1.0,
) -> float:
    """cumulative_logprob / length ** length_penalty, where the length counts
    the prompt and the generated tokens except a final EOS (as upstream)."""
    seq_len = len(tokens)
    if tokens and tokens[-1] == eos_token_id:
        seq_len -= 1
    return cumulative_logprob / (seq_len**length_penalty)


def create_sort_beams_key_function(eos_token_id: int | None, length_penalty: float):
    """A sort key ranking beams by their length-penalised score."""

    def sort_beams_key(beam: BeamSearchSequence) -> float:
        return get_beam_search_score(beam.tokens, beam.cum_logprob, eos_token_id, length_penalty)

    return sort_beams_key
