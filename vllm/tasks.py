"""Task names of the engine's two runner types (upstream: vllm/tasks.py)."""

from __future__ import annotations

from typing import Literal, get_args

GenerationTask = Literal["generate"]
GENERATION_TASKS: tuple[GenerationTask, ...] = get_args(GenerationTask)

# "embed": one vector per prompt; "classify": one logit row per prompt;
# "score": a cross-encoder's classify over a text pair; "token_embed" /
# "token_classify": one row per prompt token (ALL pooling).
PoolingTask = Literal["embed", "classify", "score", "token_embed", "token_classify"]
POOLING_TASKS: tuple[PoolingTask, ...] = get_args(PoolingTask)

SupportedTask = Literal[GenerationTask, PoolingTask]
