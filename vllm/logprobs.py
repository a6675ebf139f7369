"""Logprob containers (upstream: vllm/logprobs.py).

A request's logprobs are one entry per position: {token id: Logprob} for
the sampled (or prompt) token and the top-k candidates. Two containers hold
them, chosen by `SamplingParams.flat_logprobs`:

* `list[dict[int, Logprob]]`, the plain form (one dict and k Logprob objects
  per position);
* `FlatLogprobs`, the same data as six flat lists plus per-position
  [start, end) ranges, so a long generation creates no per-position objects
  (far less garbage-collector work). It behaves as a read-only sequence of
  position dicts, built on demand.

The first prompt position has no logprob (nothing predicts it): None in the
plain form, an empty position in the flat one.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, MutableSequence
from dataclasses import dataclass, field
from typing import overload


@dataclass
class Logprob:
    """The logprob of one token, its rank in the vocabulary (1 = most likely)
    and its decoded text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


LogprobsOnePosition = dict[int, Logprob]


@dataclass
class FlatLogprobs(MutableSequence[LogprobsOnePosition | None]):
    """Position i's entries are token_ids / logprobs / ranks / decoded_tokens
    [start_indices[i], end_indices[i])."""

    start_indices: list[int] = field(default_factory=list)
    end_indices: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    ranks: list[int | None] = field(default_factory=list)
    decoded_tokens: list[str | None] = field(default_factory=list)

    def append(self, logprobs_one_position: LogprobsOnePosition | None) -> None:
        """Add the next position (None: a position without logprobs)."""
        self.start_indices.append(len(self.logprobs))
        for token_id, logprob in (logprobs_one_position or {}).items():
            self.token_ids.append(token_id)
            self.logprobs.append(logprob.logprob)
            self.ranks.append(logprob.rank)
            self.decoded_tokens.append(logprob.decoded_token)
        self.end_indices.append(len(self.logprobs))

    def append_fast(
        self,
        token_ids: list[int],
        logprobs: list[float],
        ranks: Iterable[int | None],
        decoded_tokens: Iterable[str | None],
    ) -> None:
        """Add the next position from its columns, without building a dict.
        A token id listed twice (the sampled token also in the top-k) keeps
        one entry, its last, as the dict form would."""
        self.start_indices.append(len(self.logprobs))
        seen: dict[int, int] = {}
        for token_id, value, rank, text in zip(token_ids, logprobs, ranks, decoded_tokens):
            if token_id in seen:
                i = seen[token_id]
                self.logprobs[i], self.ranks[i], self.decoded_tokens[i] = value, rank, text
                continue
            seen[token_id] = len(self.token_ids)
            self.token_ids.append(token_id)
            self.logprobs.append(value)
            self.ranks.append(rank)
            self.decoded_tokens.append(text)
        self.end_indices.append(len(self.logprobs))

    def extend(self, logprobs_multi_positions: Iterable[LogprobsOnePosition | None]) -> None:
        if isinstance(logprobs_multi_positions, FlatLogprobs):
            for i in range(len(logprobs_multi_positions)):
                self.append_fast(*logprobs_multi_positions._columns(i))
            return
        for position in logprobs_multi_positions:
            self.append(position)

    def __len__(self) -> int:
        return len(self.start_indices)

    @overload
    def __getitem__(self, index: int) -> LogprobsOnePosition: ...

    @overload
    def __getitem__(self, index: slice) -> FlatLogprobs: ...

    def __getitem__(self, index: int | slice) -> LogprobsOnePosition | FlatLogprobs:
        if isinstance(index, slice):
            positions = range(len(self))[index]
            out = FlatLogprobs()
            for i in positions:
                out.append_fast(*self._columns(i))
            return out
        start, end = self.start_indices[index], self.end_indices[index]
        return {
            self.token_ids[j]: Logprob(self.logprobs[j], self.ranks[j], self.decoded_tokens[j])
            for j in range(start, end)
        }

    def _columns(self, i: int) -> tuple[list, list, list, list]:
        s, e = self.start_indices[i], self.end_indices[i]
        return (self.token_ids[s:e], self.logprobs[s:e], self.ranks[s:e], self.decoded_tokens[s:e])

    def __iter__(self) -> Iterator[LogprobsOnePosition]:
        for i in range(len(self)):
            yield self[i]

    def __setitem__(self, index, value) -> None:
        raise TypeError("FlatLogprobs does not support item assignment")

    def __delitem__(self, index) -> None:
        raise TypeError("FlatLogprobs does not support item deletion")

    def insert(self, index, value) -> None:
        raise TypeError("FlatLogprobs does not support insert")


# token id -> Logprob, one dict per position
PromptLogprobs = FlatLogprobs | list[LogprobsOnePosition | None]
SampleLogprobs = FlatLogprobs | list[LogprobsOnePosition]


def create_prompt_logprobs(flat_logprobs: bool) -> PromptLogprobs:
    """An empty prompt-logprobs container holding position 0 (no logprob)."""
    logprobs: PromptLogprobs = FlatLogprobs() if flat_logprobs else []
    logprobs.append(None)
    return logprobs


def create_sample_logprobs(flat_logprobs: bool) -> SampleLogprobs:
    return FlatLogprobs() if flat_logprobs else []


def append_logprobs_for_next_position(
    request_logprobs: PromptLogprobs | SampleLogprobs,
    token_ids: list[int],
    logprobs: list[float],
    decoded_tokens: Iterable[str | None],
    rank: int,
    num_logprobs: int,
) -> None:
    """Add one position: entry 0 is the sampled/prompt token with its `rank`,
    entries 1..num_logprobs the top tokens ranked 1..num_logprobs (-1: all of
    them). A token in both keeps its top-k entry."""
    if num_logprobs == -1:
        num_logprobs = len(logprobs) - 1
    token_ids, logprobs = token_ids[: num_logprobs + 1], logprobs[: num_logprobs + 1]
    ranks = itertools.chain((rank,), range(1, num_logprobs + 1))
    if isinstance(request_logprobs, FlatLogprobs):
        request_logprobs.append_fast(token_ids, logprobs, ranks, decoded_tokens)
    else:
        request_logprobs.append(
            {
                tid: Logprob(logprob=v, rank=r, decoded_token=t)
                for tid, v, r, t in zip(token_ids, logprobs, ranks, decoded_tokens)
            }
        )
