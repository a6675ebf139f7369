"""Task names of the engine's two runner types (upstream: vllm/tasks.py)."""

from __future__ import annotations

from typing import Literal, get_args

from vllm.exceptions import VLLMValidationError

GenerationTask = Literal["generate"]
GENERATION_TASKS: tuple[GenerationTask, ...] = get_args(GenerationTask)

# "embed": one vector per prompt; "classify": one logit row per prompt (a
# one-label classifier also scores text pairs, as a cross-encoder);
# "token_embed" / "token_classify": one row per prompt token (ALL pooling).
PoolingTask = Literal["embed", "classify", "token_embed", "token_classify"]
POOLING_TASKS: tuple[PoolingTask, ...] = get_args(PoolingTask)

# Task names upstream v0.28 removed, refused with its messages.
_REMOVED_POOLING_TASK_MESSAGES = {
    "score": "`score` task was removed; use `classify` instead.",
    "encode": "`encode` task was removed; use `token_embed` or `token_classify` instead.",
}


def check_removed_pooling_task(task: object) -> None:
    """Refuse a removed task name (`score`, `encode`) with upstream's message."""
    if isinstance(task, str) and (message := _REMOVED_POOLING_TASK_MESSAGES.get(task)):
        raise VLLMValidationError(message, parameter="task")


SupportedTask = Literal[GenerationTask, PoolingTask]
