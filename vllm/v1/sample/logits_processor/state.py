"""Bookkeeping between the persistent batch and its logits processors
(upstream: vllm/v1/sample/logits_processor/state.py)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import chain

from vllm.v1.sample.logits_processor.interface import (
    AddedRequest,
    BatchUpdate,
    LogitsProcessor,
    MoveDirectionality,
    MovedRequest,
    RemovedRequest,
)


class BatchUpdateBuilder:
    """Records the batch's row changes during a step; `get_and_reset` hands
    them over as one `BatchUpdate`."""

    def __init__(self) -> None:
        self.removed: list[RemovedRequest] = []
        self.added: list[AddedRequest] = []
        self.moved: list[MovedRequest] = []

    def removed_append(self, index: int) -> None:
        self.removed.append(index)

    def reuse_removed(self, index: int) -> None:
        """`index`, a row removed this step, was given to a new request."""
        self.removed.remove(index)

    def add(self, added: AddedRequest) -> None:
        self.added.append(added)

    def move(self, src: int, dst: int, direction: MoveDirectionality) -> None:
        self.moved.append((src, dst, direction))

    def get_and_reset(self, batch_size: int) -> BatchUpdate | None:
        """The changes recorded since the last call (None if there were none)."""
        if not (self.removed or self.added or self.moved):
            return None
        update = BatchUpdate(
            batch_size=batch_size, removed=self.removed, added=self.added, moved=self.moved
        )
        self.removed, self.added, self.moved = [], [], []
        return update


class LogitsProcessors:
    """The batch's processors, split by whether they can change the argmax."""

    def __init__(self, logitsprocs: Iterable[LogitsProcessor] | None = None) -> None:
        self.argmax_invariant: list[LogitsProcessor] = []
        self.non_argmax_invariant: list[LogitsProcessor] = []
        for proc in logitsprocs or ():
            (
                self.argmax_invariant if proc.is_argmax_invariant() else self.non_argmax_invariant
            ).append(proc)

    @property
    def all(self) -> Iterator[LogitsProcessor]:
        return chain(self.argmax_invariant, self.non_argmax_invariant)
