"""What the scheduler sends the workers each step (upstream:
vllm/v1/core/sched/output.py). Workers keep per-request state, so a request is
sent whole once (NewRequestData) and as diffs afterwards (CachedRequestData)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request


@dataclass
class NewRequestData:
    """A request the workers have not seen (or, under Model Runner V2, one
    resumed after preemption, sent again whole)."""

    req_id: str
    prompt_token_ids: list[int] | None
    mm_features: list[Any]
    sampling_params: SamplingParams | None
    pooling_params: Any | None
    # One list of block ids per KV cache group.
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    lora_request: LoRARequest | None
    prompt_embeds: Any | None = None
    # Upstream: which prompt positions are token ids in a prompt mixing ids and
    # embeddings. Not built (refused by Request), so always None.
    prompt_is_token_ids: list[bool] | None = None
    # V2 only: the tokens to prefill when they differ from the prompt
    # (prompt + generated tokens of a resumed request).
    prefill_token_ids: list[int] | None = None

    @classmethod
    def from_request(
        cls,
        request: Request,
        block_ids: tuple[list[int], ...],
        prefill_token_ids: list[int] | None = None,
    ) -> NewRequestData:
        return cls(
            req_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            mm_features=request.mm_features,
            sampling_params=request.sampling_params,
            pooling_params=request.pooling_params,
            block_ids=block_ids,
            num_computed_tokens=request.num_computed_tokens,
            lora_request=request.lora_request,
            prompt_embeds=request.prompt_embeds,
            prefill_token_ids=prefill_token_ids,
        )

    def __repr__(self) -> str:
        prefill = self.prefill_token_ids
        return (
            f"NewRequestData(req_id={self.req_id}, "
            f"prompt_len={len(self.prompt_token_ids or [])}, block_ids={self.block_ids}, "
            f"num_computed_tokens={self.num_computed_tokens}, "
            f"prefill_len={None if prefill is None else len(prefill)})"
        )


@dataclass
class CachedRequestData:
    """Diffs for requests the workers already hold, as parallel lists."""

    req_ids: list[str]
    # V1 runner: requests resumed from preemption; their new_block_ids
    # replace the block list instead of extending it.
    resumed_req_ids: set[str]
    # Only for pipeline parallelism: the tokens sampled last step.
    new_token_ids: list[list[int]]
    # V1 runner: req_id -> all token ids, for resumed requests that were not
    # scheduled in the previous step (the worker dropped their tokens).
    all_token_ids: dict[str, list[int]]
    # None where the request got no new blocks this step.
    new_block_ids: list[tuple[list[int], ...] | None]
    num_computed_tokens: list[int]
    num_output_tokens: list[int]

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    def is_context_phase(self, req_id: str) -> bool:
        return req_id in self.resumed_req_ids

    @classmethod
    def make_empty(cls) -> CachedRequestData:
        return cls(
            req_ids=[],
            resumed_req_ids=set(),
            new_token_ids=[],
            all_token_ids={},
            new_block_ids=[],
            num_computed_tokens=[],
            num_output_tokens=[],
        )


@dataclass
class ScheduledEncoderInputStats:
    """Encoder inputs scheduled in a step (upstream's record; multimodal inputs
    are not built, so never filled)."""

    num_inputs: int = 0
    output_tokens: int = 0


@dataclass
class SchedulerOutput:
    """Everything the workers need to run one step."""

    # Requests scheduled for the first time (or resumed, under V2).
    scheduled_new_reqs: list[NewRequestData]
    # Requests the workers already hold.
    scheduled_cached_reqs: CachedRequestData
    # req_id -> number of tokens scheduled this step
    num_scheduled_tokens: dict[str, int]
    # sum(num_scheduled_tokens.values())
    total_num_scheduled_tokens: int
    # req_id -> speculative tokens to verify (absent when there are none)
    scheduled_spec_decode_tokens: dict[str, list[int]]
    # req_id -> encoder input indices to process (multimodal; unused here)
    scheduled_encoder_inputs: dict[str, list[int]]
    # Per KV cache group: blocks shared by every running request (cascade attention).
    num_common_prefix_blocks: list[int]
    # Requests that finished since the previous step: the workers free their state.
    finished_req_ids: set[str]
    # Encoder cache entries to free (multimodal; unused here).
    free_encoder_mm_hashes: list[str]
    # Requests preempted this step.
    preempted_req_ids: set[str] | None = None
    # Whether the scheduled requests hold structured-output requests.
    has_structured_output_requests: bool = False
    # Async scheduling with drafts: per request, how many of its drafts its
    # grammar ruled out (Scheduler.update_draft_token_ids_in_output; they
    # are -1 in scheduled_spec_decode_tokens and not counted as drafted).
    num_invalid_spec_tokens: dict[str, int] | None = None
    kv_connector_metadata: Any | None = None
    # Upstream v0.28's fields for features not built here (encoder inputs,
    # speculative decoding, KV / EC connectors, partial-block caching). The
    # scheduler never sets them, so workers never see anything but defaults.
    scheduled_encoder_input_stats: ScheduledEncoderInputStats | None = None
    pending_structured_output_tokens: bool = False
    ec_connector_metadata: Any | None = None
    ec_manager_metadata: Any | None = None
    new_block_ids_to_zero: list[int] | None = None
    kv_cache_block_copies: list[Any] | None = None
    partial_tail_offloads: dict[str, list[tuple[int, int, int]]] | None = None
    num_spec_tokens_to_schedule: int = 0

    @classmethod
    def make_empty(cls) -> SchedulerOutput:
        return cls(
            scheduled_new_reqs=[],
            scheduled_cached_reqs=CachedRequestData.make_empty(),
            num_scheduled_tokens={},
            total_num_scheduled_tokens=0,
            scheduled_spec_decode_tokens={},
            scheduled_encoder_inputs={},
            num_common_prefix_blocks=[],
            finished_req_ids=set(),
            free_encoder_mm_hashes=[],
        )


@dataclass
class GrammarOutput:
    """The structured-output token masks of one step (upstream:
    vllm/v1/core/sched/output.py), sent to the workers with sample_tokens."""

    # The requests that sample under a grammar this step.
    structured_output_request_ids: list[str]
    # int32 [len(structured_output_request_ids), ceil(vocab_size / 32)]: row i
    # belongs to structured_output_request_ids[i]; bit j (word j // 32, bit
    # j % 32) set = token j allowed (xgrammar's layout).
    grammar_bitmask: np.ndarray
