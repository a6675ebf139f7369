"""What the model runner hands back to the scheduler (upstream: vllm/v1/outputs.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import torch


class LogprobsLists(NamedTuple):
    # [num_positions, max_num_logprobs + 1]: the sampled token first, then the top-k
    logprob_token_ids: list[list[int]]
    # [num_positions, max_num_logprobs + 1]
    logprobs: list[list[float]]
    # [num_positions]: rank of the sampled token (1 = most likely)
    sampled_token_ranks: list[int]
    # [num_reqs + 1]: where each request's positions start, when a request
    # may have several (speculative decoding emits a variable number of
    # tokens per request); None: one position per request.
    cu_num_generated_tokens: list[int] | None = None

    def slice(self, start: int, end: int) -> LogprobsLists:
        return LogprobsLists(
            self.logprob_token_ids[start:end],
            self.logprobs[start:end],
            self.sampled_token_ranks[start:end],
        )

    def slice_request(self, req_idx: int, num_positions: int) -> LogprobsLists:
        """The first `num_positions` positions of batch row `req_idx`."""
        start = req_idx
        if self.cu_num_generated_tokens is not None:
            start = self.cu_num_generated_tokens[req_idx]
        return self.slice(start, start + num_positions)


class LogprobsTensors(NamedTuple):
    # [num_positions, max_num_logprobs + 1] int32/int64
    logprob_token_ids: torch.Tensor
    # [num_positions, max_num_logprobs + 1] float32
    logprobs: torch.Tensor
    # [num_positions] int
    selected_token_ranks: torch.Tensor

    def tolists(self, cu_num_generated_tokens: list[int] | None = None) -> LogprobsLists:
        return LogprobsLists(
            self.logprob_token_ids.tolist(),
            self.logprobs.tolist(),
            self.selected_token_ranks.tolist(),
            cu_num_generated_tokens,
        )

    @staticmethod
    def empty_cpu(num_positions: int, num_tokens_per_position: int) -> LogprobsTensors:
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
class KVConnectorOutput:
    """What a KV connector reports after a step (upstream's record). KV
    connectors are not built, so no runner here fills one in."""

    finished_sending: set[str] | None = None
    finished_recving: set[str] | None = None
    kv_connector_stats: Any | None = None
    kv_cache_events: Any | None = None
    kv_connector_worker_meta: Any | None = None
    invalid_block_ids: set[int] = field(default_factory=set)
    expected_finished_count: int = 0

    def is_empty(self) -> bool:
        return (
            not self.finished_sending
            and not self.finished_recving
            and not self.kv_connector_stats
            and not self.kv_cache_events
            and not self.invalid_block_ids
        )


@dataclass
class ECConnectorOutput:
    """What an encoder-cache connector reports after a step (upstream's
    record). EC connectors are not built."""

    finished_sending: set[str] | None = None
    finished_recving: set[str] | None = None
    ec_connector_worker_meta: Any | None = None


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
    # Set only by KV / EC connectors, which are not built: always None here.
    kv_connector_output: KVConnectorOutput | None = None
    ec_connector_output: ECConnectorOutput | None = None
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


@dataclass
class DraftTokenIds:
    """Draft tokens the runner proposed after a step, per request (speculative
    decoding): `draft_token_ids[i]` for `req_ids[i]`, [] for none. With sync
    scheduling the engine core takes them from the output rank
    (`Executor.take_draft_token_ids`, msgpack over the mp / Ray executors) and
    hands them to `Scheduler.update_draft_token_ids` before the next step."""

    req_ids: list[str]
    draft_token_ids: list[list[int]]


class ScheduledTokens(Protocol):
    """What make_empty_encoder_model_runner_output reads of a SchedulerOutput
    (naming that class here would make the scheduler's output and the runner's
    output import each other)."""

    num_scheduled_tokens: dict[str, int]


def make_empty_encoder_model_runner_output(
    scheduler_output: ScheduledTokens,
) -> ModelRunnerOutput:
    """The output of a step that only ran encoders: every scheduled request
    present, no tokens sampled. `scheduler_output` is a `SchedulerOutput`."""
    if not scheduler_output.num_scheduled_tokens:
        return EMPTY_MODEL_RUNNER_OUTPUT
    req_ids = list(scheduler_output.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
        sampled_token_ids=[[] for _ in req_ids],
        pooler_output=[None for _ in req_ids],
    )
