"""Logits processors of the V1 sampler (upstream: vllm/v1/sample/logits_processor/).

Only the built-in ones exist: logit bias and min_tokens (min-p is applied by
the sampler itself). Loading custom processors from plugins is not built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from vllm.v1.sample.logits_processor.builtin import (
    BUILTIN_LOGITS_PROCESSORS,
    LogitBiasLogitsProcessor,
    MinTokensLogitsProcessor,
    process_dict_updates,
)
from vllm.v1.sample.logits_processor.interface import (
    BatchUpdate,
    LogitsProcessor,
    MoveDirectionality,
)
from vllm.v1.sample.logits_processor.state import BatchUpdateBuilder, LogitsProcessors

if TYPE_CHECKING:
    from vllm.config import VllmConfig


def build_logitsprocs(
    vllm_config: VllmConfig,
    device: torch.device,
    is_pin_memory: bool,
    is_pooling_model: bool = False,
) -> LogitsProcessors:
    """The processors of one persistent batch (none for pooling models)."""
    if is_pooling_model:
        return LogitsProcessors()
    return LogitsProcessors(
        cls(vllm_config, device, is_pin_memory) for cls in BUILTIN_LOGITS_PROCESSORS
    )


__all__ = [
    "BatchUpdate",
    "BatchUpdateBuilder",
    "LogitBiasLogitsProcessor",
    "LogitsProcessor",
    "LogitsProcessors",
    "MinTokensLogitsProcessor",
    "MoveDirectionality",
    "build_logitsprocs",
    "process_dict_updates",
]
