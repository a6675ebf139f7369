"""What the model runner hands back to the scheduler (upstream: vllm/v1/outputs.py)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch


class LogprobsLists(NamedTuple):
    # [num_positions, max_num_logprobs + 1]: the sampled token first, then the top-k
    logprob_token_ids: list[list[int]]
    # [num_positions, max_num_logprobs + 1]
    logprobs: list[list[float]]
    # [num_positions]: rank of the sampled token (1 = most likely)
    sampled_token_ranks: list[int]

    def slice(self, start: int, end: int) -> "LogprobsLists":
        return LogprobsLists(self.logprob_token_ids[start:end], self.logprobs[start:end],
                             self.sampled_token_ranks[start:end])


class LogprobsTensors(NamedTuple):
    # [num_positions, max_num_logprobs + 1] int32/int64
    logprob_token_ids: torch.Tensor
    # [num_positions, max_num_logprobs + 1] float32
    logprobs: torch.Tensor
    # [num_positions] int
    selected_token_ranks: torch.Tensor

    def tolists(self) -> LogprobsLists:
        return LogprobsLists(self.logprob_token_ids.tolist(), self.logprobs.tolist(),
                             self.selected_token_ranks.tolist())

    @staticmethod
    def empty_cpu(num_positions: int, num_tokens_per_position: int) -> "LogprobsTensors":
        """Preallocated CPU tensors, filled chunk by chunk (prompt logprobs)."""
        return LogprobsTensors(
            torch.empty((num_positions, num_tokens_per_position), dtype=torch.int32),
            torch.empty((num_positions, num_tokens_per_position), dtype=torch.float32),
            torch.empty((num_positions,), dtype=torch.int32),
        )


@dataclass
class SamplerOutput:
    # [num_reqs, max_num_generated_tokens]; -1 pads rows with fewer tokens
    sampled_token_ids: torch.Tensor
    logprobs_tensors: LogprobsTensors | None


@dataclass
class ModelRunnerOutput:
    """One step's results, indexed by the runner's batch order."""

    # [num_reqs]
    req_ids: list[str]
    # req_id -> index in req_ids
    req_id_to_index: dict[str, int]
    # num_reqs x num_generated_tokens; [] for a request still mid-prefill
    sampled_token_ids: list[list[int]] = field(default_factory=list)
    # [num_reqs, max_num_logprobs + 1] when logprobs were asked for
    logprobs: LogprobsLists | None = None
    # req_id -> prompt logprobs computed this step
    prompt_logprobs_dict: dict[str, LogprobsTensors | None] = field(default_factory=dict)
    pooler_output: list[Any] | None = None
    # req_id -> number of NaNs in its logits (debugging aid)
    num_nans_in_logits: dict[str, int] | None = None


class AsyncModelRunnerOutput(ABC):
    """A step's output whose device-to-host copy may still be in flight (async
    scheduling): the engine core calls `get_output()` when it needs the result."""

    @abstractmethod
    def get_output(self) -> ModelRunnerOutput:
        """Wait for the copy and return the step's output."""
        raise NotImplementedError


EMPTY_MODEL_RUNNER_OUTPUT = ModelRunnerOutput(req_ids=[], req_id_to_index={})
