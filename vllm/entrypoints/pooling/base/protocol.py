"""Request fields every pooling route takes (upstream:
vllm/entrypoints/pooling/base/protocol.py).

`input` is a string, a list of strings, a list of token ids or a list of
token-id lists (OpenAI's four forms), at most MAX_PROMPTS_PER_REQUEST prompts.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from vllm.entrypoints.openai.protocol_base import (
    MAX_N_SEQUENCES,
    MAX_PROMPTS_PER_REQUEST,
    OpenAIBaseModel,
    StrictBool,
    StrictInt,
    TokenId,
)

PoolingInput = (
    Annotated[list[TokenId], Field(max_length=MAX_N_SEQUENCES * 64, fail_fast=True)]
    | Annotated[
        list[Annotated[list[TokenId], Field(fail_fast=True)]],
        Field(max_length=MAX_PROMPTS_PER_REQUEST, fail_fast=True),
    ]
    | str
    | Annotated[list[str], Field(max_length=MAX_PROMPTS_PER_REQUEST, fail_fast=True)]
)


class PoolingBasicRequestMixin(OpenAIBaseModel):
    model: str | None = None
    input: PoolingInput
    user: str | None = None
    # -1: keep max_model_len tokens; k: keep k tokens.
    truncate_prompt_tokens: StrictInt | None = Field(None, ge=-1)
    # --- vLLM's extras ---
    add_special_tokens: StrictBool = True
    priority: StrictInt = 0
