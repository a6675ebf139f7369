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
    SparseCellsLogitsProcessor,
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

# Upstream's refusal of a logits processor under speculative decoding. Ours
# honours the built-in ones (logit_bias, min_tokens) at every draft position;
# custom processors cannot be loaded at all, so this only guards a processor
# that cannot place its edits at a draft position.
STR_SPEC_DEC_REJECTS_LOGITSPROCS = (
    "Custom logits processors are not supported when speculative decoding is enabled."
)


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
    "STR_SPEC_DEC_REJECTS_LOGITSPROCS",
    "SparseCellsLogitsProcessor",
    "build_logitsprocs",
    "process_dict_updates",
]
