"""The engine core's view of one request (upstream: vllm/v1/request.py)."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vllm.sampling_params import SamplingParams
from vllm.utils import ConstantList
from vllm.v1.engine import EngineCoreEvent, EngineCoreEventType, EngineCoreRequest, FinishReason

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest
    from vllm.v1.core.block_hash import BlockHash
    from vllm.v1.structured_output.request import StructuredOutputRequest


class RequestStatus(enum.IntEnum):
    """Status of a request. Every status after PREEMPTED is a finished one."""

    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()
    FINISHED_REPETITION = enum.auto()

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def get_finished_reason(status: RequestStatus) -> FinishReason | None:
        return _FINISHED_REASON_MAP.get(status)


# FINISHED_IGNORED: a prompt too long to ever fit is reported as "length".
_FINISHED_REASON_MAP = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_IGNORED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
    RequestStatus.FINISHED_REPETITION: FinishReason.REPETITION,
}


# Upstream v0.28 request fields whose features are not built: their defaults
# are accepted, any other value is refused by name.
_UNBUILT_FIELDS: dict[str, tuple[Any, str]] = {
    "prompt_is_token_ids": (None, "prompts mixing embeddings and token ids"),
    "resumable": (False, "resumable streaming-input requests"),
    "session_id": (None, "streaming-input sessions"),
    "abort_immediately": (False, "abort-on-arrival requests"),
}


def _refuse_unbuilt_fields(**values: Any) -> None:
    for name, value in values.items():
        default, feature = _UNBUILT_FIELDS[name]
        if value != default:
            raise NotImplementedError(
                f"Request field {name}={value!r}: {feature} are not built yet."
            )


class Request:
    """A request inside the engine core.

    Token bookkeeping (all counts in tokens):
        all_token_ids = prompt_token_ids + output_token_ids
        num_tokens            = len(all_token_ids)
        num_computed_tokens   = how many of them already have KV in the cache
                                (advanced optimistically when scheduled)
        num_tokens_with_spec  = num_tokens + len(spec_token_ids)
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int] | None,
        sampling_params: SamplingParams | None,
        pooling_params: Any | None = None,
        eos_token_id: int | None = None,
        client_index: int = 0,
        arrival_time: float | None = None,
        prompt_embeds: Any | None = None,
        mm_features: list[Any] | None = None,
        lora_request: LoRARequest | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
        trace_headers: dict[str, str] | None = None,
        block_hasher: Callable[[Request], list[BlockHash]] | None = None,
        prompt_is_token_ids: list[bool] | None = None,
        resumable: bool = False,
        session_id: str | None = None,
        reasoning_ended: bool | None = None,
        reasoning_parser_kwargs: dict[str, Any] | None = None,
        abort_immediately: bool = False,
    ) -> None:
        _refuse_unbuilt_fields(
            prompt_is_token_ids=prompt_is_token_ids,
            resumable=resumable,
            session_id=session_id,
            abort_immediately=abort_immediately,
        )
        self.request_id = request_id
        self.client_index = client_index
        self.priority = priority
        self.sampling_params = sampling_params
        self.pooling_params = pooling_params
        self.eos_token_id = eos_token_id
        self.lora_request = lora_request
        self.cache_salt = cache_salt
        self.mm_features = mm_features or []
        self.prompt_embeds = prompt_embeds
        self.trace_headers = trace_headers
        self.arrival_time = arrival_time if arrival_time is not None else time.time()

        self.status = RequestStatus.WAITING
        # The constraint and, once compiled, the grammar; a structured request
        # waits in WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR until the grammar is
        # ready (or failed to compile).
        self.structured_output_request: StructuredOutputRequest | None = None
        if sampling_params is not None and sampling_params.structured_outputs is not None:
            from vllm.v1.structured_output.request import StructuredOutputRequest

            self.structured_output_request = StructuredOutputRequest(
                sampling_params.structured_outputs,
                reasoning_ended=reasoning_ended,
                reasoning_parser_kwargs=reasoning_parser_kwargs,
            )
            self.status = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
        self.events: list[EngineCoreEvent] = []
        self.stop_reason: int | str | None = None
        # "full": KV cache events also cover the prefix-cache blocks this
        # request reuses; "incremental" (default): only blocks it stores.
        extra_args = sampling_params.extra_args if sampling_params is not None else None
        self.kv_cache_report_mode: str = (extra_args or {}).get(
            "kv_cache_report_mode", "incremental"
        )
        self.num_nans_in_logits = 0

        self.max_tokens: int
        if sampling_params is not None:
            # The input processor turns None ("up to max_model_len") into a count.
            assert sampling_params.max_tokens is not None, "max_tokens must be resolved"
            self.max_tokens = sampling_params.max_tokens
        elif pooling_params is not None:
            self.max_tokens = 1
        else:
            raise ValueError("sampling_params and pooling_params can't both be unset")

        if prompt_token_ids is None:
            # An embeddings-only prompt: placeholder ids, one per embedding row.
            assert prompt_embeds is not None, "prompt_token_ids or prompt_embeds required"
            prompt_token_ids = [0] * len(prompt_embeds)
        self.prompt_token_ids = prompt_token_ids
        self.num_prompt_tokens = len(prompt_token_ids)
        # (start, end) -> digest of those prompt-embedding rows (block hashing).
        self._prompt_embeds_per_block_hashes: dict[tuple[int, int], bytes] = {}
        self._output_token_ids: list[int] = []
        self._all_token_ids: list[int] = list(prompt_token_ids)
        self.output_token_ids = ConstantList(self._output_token_ids)
        self.all_token_ids = ConstantList(self._all_token_ids)
        self.spec_token_ids: list[int] = []
        self.num_computed_tokens = 0
        # Prompt tokens served from the prefix cache; -1 until first scheduled.
        self.num_cached_tokens = -1
        self.num_preemptions = 0
        # Async scheduling: decode steps scheduled whose tokens are not in yet.
        self.num_output_placeholders = 0
        self.num_external_computed_tokens = 0
        # Whether the last scheduled step stopped short of the known tokens (a
        # prompt chunk, which samples nothing); set by the scheduler.
        self.is_prefill_chunk = False

        self.block_hashes: list[BlockHash] = []
        self._block_hasher = block_hasher
        self.update_block_hashes()
        self.skip_reading_prefix_cache = self.get_skip_reading_prefix_cache()

    @classmethod
    def from_engine_core_request(
        cls,
        request: EngineCoreRequest,
        block_hasher: Callable[[Request], list[BlockHash]] | None,
    ) -> Request:
        return cls(
            request_id=request.request_id,
            client_index=request.client_index,
            prompt_token_ids=request.prompt_token_ids,
            prompt_embeds=request.prompt_embeds,
            mm_features=request.mm_features,
            sampling_params=request.sampling_params,
            pooling_params=request.pooling_params,
            eos_token_id=request.eos_token_id,
            arrival_time=request.arrival_time,
            lora_request=request.lora_request,
            cache_salt=request.cache_salt,
            priority=request.priority,
            trace_headers=request.trace_headers,
            block_hasher=block_hasher,
            prompt_is_token_ids=request.prompt_is_token_ids,
            resumable=request.resumable,
            session_id=request.session_id,
            reasoning_ended=request.reasoning_ended,
            reasoning_parser_kwargs=request.reasoning_parser_kwargs,
            abort_immediately=request.abort_immediately,
        )

    def append_output_token_ids(self, token_ids: int | list[int]) -> None:
        if isinstance(token_ids, int):
            self._output_token_ids.append(token_ids)
            self._all_token_ids.append(token_ids)
        else:
            self._output_token_ids.extend(token_ids)
            self._all_token_ids.extend(token_ids)
        self.update_block_hashes()

    def update_block_hashes(self) -> None:
        """Hash the blocks that became full since the last call."""
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))

    @property
    def get_hash_new_full_blocks(self) -> Callable[[], list[BlockHash]] | None:
        """The hasher bound to this request (None without prefix caching)."""
        hasher = self._block_hasher
        return None if hasher is None else (lambda: hasher(self))

    @property
    def num_encoder_inputs(self) -> int:
        return len(self.mm_features)

    @property
    def has_encoder_inputs(self) -> bool:
        return self.num_encoder_inputs > 0

    def get_num_encoder_embeds(self, input_id: int) -> int:
        return self.mm_features[input_id].mm_position.get_num_embeds()

    @property
    def use_structured_output(self) -> bool:
        return self.structured_output_request is not None

    @property
    def is_output_corrupted(self) -> bool:
        return False

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self._all_token_ids) + len(self.spec_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    def get_skip_reading_prefix_cache(self) -> bool:
        """Prompt logprobs need every prompt position computed: no cache hits;
        token-level pooling likewise (PoolingParams.skip_reading_prefix_cache)."""
        if self.pooling_params is not None:
            return bool(self.pooling_params.skip_reading_prefix_cache)
        sp = self.sampling_params
        return sp is not None and sp.prompt_logprobs is not None

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finished_reason(self) -> FinishReason | None:
        return RequestStatus.get_finished_reason(self.status)

    def record_event(self, event_type: EngineCoreEventType, timestamp: float | None = None) -> None:
        self.events.append(EngineCoreEvent.new_event(event_type, timestamp))

    def take_events(self) -> list[EngineCoreEvent] | None:
        if not self.events:
            return None
        events, self.events = self.events, []
        return events

    def __lt__(self, other: Request) -> bool:
        """Order for the priority queue: lower priority value first, then
        earlier arrival, then request id as a stable tie-break."""
        return (self.priority, self.arrival_time, self.request_id) < (
            other.priority,
            other.arrival_time,
            other.request_id,
        )

    def __repr__(self) -> str:
        return (
            f"Request(id={self.request_id}, status={self.status}, "
            f"num_tokens={self.num_tokens}, computed={self.num_computed_tokens})"
        )
