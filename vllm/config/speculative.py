"""Speculative decoding (upstream: vllm/config/speculative.py).

Only the fields a caller names to ask for it are here; speculative decoding is
not built, so `VllmConfig` refuses a config that sets one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SpeculativeConfig:
    """What to draft with and how many tokens per step."""

    model: str | None = None
    method: str | None = None
    num_speculative_tokens: int | None = None
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None
    num_speculative_tokens_per_batch_size: list[tuple[int, int, int]] | None = None
    parallel_drafting: bool = False

    def __post_init__(self) -> None:
        if self.num_speculative_tokens is not None and self.num_speculative_tokens < 1:
            raise ValueError(
                f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}"
            )
