"""Scheduler configuration (upstream: vllm/config/scheduler.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

SchedulerPolicy = Literal["fcfs", "priority"]


@dataclass
class SchedulerConfig:
    """Limits of one scheduling step and the queueing policy."""

    # Used when no entry point picked a default (`EngineArgs.
    # _set_default_max_num_seqs_and_batched_tokens_args`), as upstream.
    DEFAULT_MAX_NUM_BATCHED_TOKENS: ClassVar[int] = 2048
    DEFAULT_MAX_NUM_SEQS: ClassVar[int] = 128

    max_num_batched_tokens: int = 2048  # token budget of one step
    max_num_seqs: int = 128  # most requests in one step
    max_model_len: int = 8192  # copied from ModelConfig by VllmConfig
    enable_chunked_prefill: bool = True
    policy: SchedulerPolicy = "fcfs"
    # A prefill longer than this is chunked into pieces of at most this many
    # tokens even when the budget would allow more (0 = off).
    long_prefill_token_threshold: int = 0
    # None = on where supported (resolved by VllmConfig).
    async_scheduling: bool | None = None
    # Emit streamed outputs every this many tokens.
    stream_interval: int = 1
    max_num_partial_prefills: int = 1
    is_encoder_decoder: bool = False
    # Fraction of KV cache blocks kept free when admitting a waiting or
    # preempted request while others run (0 = off), so running ones can grow.
    watermark: float = 0.0
    # Upstream: never split one multimodal item across steps. Multimodal
    # inputs are not built (refused on arrival), so there is nothing to split.
    disable_chunked_mm_input: bool = False

    def __post_init__(self) -> None:
        if self.policy not in ("fcfs", "priority"):
            raise ValueError(
                f"Unknown scheduling policy {self.policy!r}; choose 'fcfs' or 'priority'."
            )
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be positive.")
        if self.stream_interval < 1:
            raise ValueError("stream_interval must be at least 1.")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}.")

    def verify_with_model_len(self, max_model_len: int) -> None:
        self.max_model_len = max_model_len
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than "
                f"max_model_len ({max_model_len}). This effectively limits the maximum "
                "sequence length to max_num_batched_tokens and makes vLLM reject longer "
                "sequences. Please increase max_num_batched_tokens or decrease max_model_len."
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be greater than "
                f"or equal to max_num_seqs ({self.max_num_seqs})."
            )
