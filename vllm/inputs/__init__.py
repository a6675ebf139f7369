"""Prompt types accepted by `LLM.generate` (upstream: vllm/inputs/)."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class TextPrompt(TypedDict):
    """A text prompt, tokenized by the engine."""

    prompt: str
    multi_modal_data: NotRequired[Any]
    mm_processor_kwargs: NotRequired[dict[str, Any]]
    cache_salt: NotRequired[str]


class TokensPrompt(TypedDict):
    """A prompt given as token ids."""

    prompt_token_ids: list[int]
    prompt: NotRequired[str]
    multi_modal_data: NotRequired[Any]
    mm_processor_kwargs: NotRequired[dict[str, Any]]
    cache_salt: NotRequired[str]


SingletonPrompt = str | TextPrompt | TokensPrompt
PromptType = SingletonPrompt

__all__ = ["TextPrompt", "TokensPrompt", "SingletonPrompt", "PromptType"]
