"""Messages between the front end and the engine core (upstream:
vllm/v1/engine/__init__.py). msgspec structs: they cross process boundaries
as msgpack, never pickle."""

from __future__ import annotations

import enum
import time
from typing import Any

import msgspec
import torch

from vllm.exceptions import VLLMNotFoundError
from vllm.lora.request import LoRARequest
from vllm.pooling_params import PoolingParams
from vllm.sampling_params import SamplingParams
from vllm.v1.outputs import LogprobsLists, LogprobsTensors

# These are possible values of RequestOutput.finish_reason,
# so form part of the external API.
FINISH_REASON_STRINGS = ("stop", "length", "abort", "error", "repetition")


class FinishReason(enum.IntEnum):
    """Why a request finished.

    stop: a stop string or stop token was emitted (EOS included);
    length: max_tokens or max_model_len was reached;
    abort: aborted by the client; error: a retryable request-level error;
    repetition: a repetitive token pattern was detected.
    """

    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3
    REPETITION = 4

    def __str__(self) -> str:
        return FINISH_REASON_STRINGS[self.value]


class EngineCoreRequest(
    msgspec.Struct,
    array_like=True,
    omit_defaults=True,
    gc=False,
):
    request_id: str
    prompt_token_ids: list[int] | None
    mm_features: list[Any] | None
    sampling_params: SamplingParams | None
    pooling_params: PoolingParams | None
    eos_token_id: int | None
    arrival_time: float
    lora_request: LoRARequest | None
    cache_salt: str | None
    data_parallel_rank: int | None
    prompt_embeds: Any | None = None
    # Index of the client, used to route outputs back to it with several front ends.
    client_index: int = 0
    current_wave: int = 0
    priority: int = 0
    trace_headers: dict[str, str] | None = None
    # The user-facing id; request_id is the engine's unique internal id.
    external_req_id: str | None = None
    # Upstream v0.28's fields for features not built here (prompts mixing
    # embeddings and token ids, resumable streaming-input sessions,
    # abort-on-arrival). They travel with their defaults; a request that sets
    # one is refused by `Request` with an error naming the field.
    prompt_is_token_ids: list[bool] | None = None
    resumable: bool = False
    # With a reasoning parser (structured_outputs_config.reasoning_parser):
    # whether the prompt already ended the reasoning (None: the parser
    # decides from the prompt), and the kwargs the engine core builds this
    # request's parser with ({"chat_template_kwargs": {...}}). Where the
    # grammar starts depends on both (vllm/v1/structured_output).
    reasoning_ended: bool | None = None
    reasoning_parser_kwargs: dict[str, Any] | None = None
    abort_immediately: bool = False
    session_id: str | None = None

    @property
    def params(self) -> SamplingParams | Any:
        """The request's sampling (or pooling) params."""
        if self.sampling_params is not None:
            return self.sampling_params
        assert self.pooling_params is not None
        return self.pooling_params


class EngineCoreEventType(enum.IntEnum):
    QUEUED = 1
    SCHEDULED = 2
    PREEMPTED = 3


class EngineCoreEvent(msgspec.Struct):
    """A timestamped engine-core event of one request (for metrics)."""

    type: EngineCoreEventType
    timestamp: float

    @classmethod
    def new_event(
        cls, event_type: EngineCoreEventType, timestamp: float | None = None
    ) -> EngineCoreEvent:
        return cls(event_type, time.monotonic() if timestamp is None else timestamp)


class EngineCoreOutput(
    msgspec.Struct,
    array_like=True,
    omit_defaults=True,
    gc=False,
):
    request_id: str
    new_token_ids: list[int]
    new_logprobs: LogprobsLists | None = None
    new_prompt_logprobs_tensors: LogprobsTensors | None = None
    # A pooling request's result (embedding / scores), when it finishes.
    pooling_output: torch.Tensor | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    events: list[EngineCoreEvent] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    trace_headers: dict[str, str] | None = None
    # Number of prompt tokens served from the prefix cache (first output only).
    num_cached_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class UtilityResult:
    """Wraps the result of a utility call so that it can be sent as one value."""

    def __init__(self, r: Any = None):
        self.result = r


class UtilityOutput(
    msgspec.Struct,
    array_like=True,
    gc=False,
):
    call_id: int
    failure_message: str | None = None
    result: Any | None = None
    # What kind of error the call raised (UTILITY_ERROR_KINDS), so that the
    # client raises the same kind: "not_found" (VLLMNotFoundError, e.g. a
    # missing LoRA adapter), "value", "type", "not_implemented"; None: other.
    failure_kind: str | None = None


# Error kinds a utility failure carries back, in the order they are tested
# (subclasses first); the client raises the class named here.
UTILITY_ERROR_KINDS: tuple[tuple[str, type[Exception]], ...] = (
    ("not_found", VLLMNotFoundError),
    ("value", ValueError),
    ("type", TypeError),
    ("not_implemented", NotImplementedError),
)


class EngineCoreOutputs(
    msgspec.Struct,
    array_like=True,
    omit_defaults=True,
    gc=False,
):
    engine_index: int = 0
    outputs: list[EngineCoreOutput] = []
    # A SchedulerStats (vllm/v1/metrics/stats.py). Declared Any on purpose: msgspec decodes
    # by this annotation, and the client rebuilds the dataclass from the plain dict
    # (core_client_mp._restore_stats), dropping keys it does not know.
    scheduler_stats: Any | None = None
    timestamp: float = 0.0
    utility_output: UtilityOutput | None = None
    finished_requests: set[str] | None = None
    # In DP mode, signals that the current wave of requests is finished.
    wave_complete: int | None = None
    start_wave: int | None = None

    def __post_init__(self) -> None:
        if self.timestamp == 0.0:
            self.timestamp = time.monotonic()


class EngineCoreRequestType(enum.Enum):
    """First frame of a message to the engine core: what the rest is."""

    ADD = b"\x00"
    ABORT = b"\x01"
    START_DP_WAVE = b"\x02"
    UTILITY = b"\x03"
    EXECUTOR_FAILED = b"\x04"
