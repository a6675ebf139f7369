"""The logits-processor interface of the V1 sampler
(upstream: vllm/v1/sample/logits_processor/interface.py).

A logits processor keeps per-row state for the requests of the persistent
batch and edits the logits of a step in one batched op. The batch tells it,
once per step, which rows were removed, which requests were added (and where)
and which rows moved, as a `BatchUpdate`; the processor then rebuilds whatever
tensors it applies.

Processors are either argmax-invariant (they never change which token is most
likely, e.g. min-p: the sampler applies them to random rows only, after the
temperature) or not (logit bias, min_tokens: they apply to every row, before
the penalties and before greedy sampling).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum, auto
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.sampling_params import SamplingParams


class MoveDirectionality(Enum):
    # a -> b: the request in row a now lives in row b (row a is empty)
    UNIDIRECTIONAL = auto()
    # a <-> b: the two rows exchanged their requests
    SWAP = auto()


# (row, params, prompt token ids, output token ids). The output list is the
# batch's own list for the request: it grows as tokens are sampled, so a
# processor may keep a reference and read its length every step.
AddedRequest = tuple[int, "SamplingParams", "list[int] | None", "list[int]"]
# (from row, to row, directionality)
MovedRequest = tuple[int, int, MoveDirectionality]
# the row that was emptied
RemovedRequest = int


@dataclass(frozen=True)
class BatchUpdate:
    """What changed in the persistent batch since the previous step.

    Apply in this order: `added` (a request may take the row of a removed
    one), then `removed` (rows that stayed empty), then `moved`, in list order.
    """

    batch_size: int  # number of live rows after the update
    removed: Sequence[RemovedRequest]
    added: Sequence[AddedRequest]
    moved: Sequence[MovedRequest]


class LogitsProcessor(ABC):
    """One kind of logits edit, batched over the rows that need it."""

    @abstractmethod
    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        raise NotImplementedError

    @abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Edit `logits` [num_reqs, vocab] (in place or not); return the result."""
        raise NotImplementedError

    @abstractmethod
    def is_argmax_invariant(self) -> bool:
        """True when the processor can never change a row's argmax, so
        greedy rows can skip it."""
        raise NotImplementedError

    @abstractmethod
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Take the batch's changes (None: no rows changed; per-request state,
        such as how many tokens were generated, may still have)."""
        raise NotImplementedError
