"""Logprob containers (upstream: vllm/logprobs.py)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Logprob:
    """The logprob of one token, its rank in the vocabulary (1 = most likely)
    and its decoded text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# token id -> Logprob, one dict per position
PromptLogprobs = list[dict[int, Logprob] | None]
SampleLogprobs = list[dict[int, Logprob]]
