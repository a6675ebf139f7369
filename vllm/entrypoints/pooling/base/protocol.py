"""Request fields the pooling routes share (upstream:
vllm/entrypoints/pooling/base/protocol.py), as mixins each route's request
classes combine:

- PoolingBasicRequestMixin: model, user, truncation, priority;
- CompletionRequestMixin: `input`, a string, a list of strings, a list of
  token ids or a list of token-id lists (OpenAI's four forms), at most
  MAX_PROMPTS_PER_REQUEST prompts; special tokens added by default;
- ChatRequestMixin: `messages`, one conversation rendered with the chat
  template (text only), special tokens left to the template by default;
- EncodingRequestMixin: how the outputs are written (see ../utils.py);
- EmbedRequestMixin / ClassifyRequestMixin: the pooler's options.

As upstream v0.28, `normalize` is gone (an embedding's normalization is its
`use_activation`) and the tasks "score" / "encode" are refused by name.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from vllm.entrypoints.openai.protocol import ChatMessageParam
from vllm.entrypoints.openai.protocol_base import (
    MAX_N_SEQUENCES,
    MAX_PROMPTS_PER_REQUEST,
    Int64,
    OpenAIBaseModel,
    StrictBool,
    StrictInt,
    TokenId,
)
from vllm.exceptions import VLLMValidationError
from vllm.tasks import check_removed_pooling_task
from vllm.utils.serial_utils import EmbedDType, EncodingFormat, Endianness

PoolingInput = (
    Annotated[list[TokenId], Field(max_length=MAX_N_SEQUENCES * 64, fail_fast=True)]
    | Annotated[
        list[Annotated[list[TokenId], Field(fail_fast=True)]],
        Field(max_length=MAX_PROMPTS_PER_REQUEST, fail_fast=True),
    ]
    | str
    | Annotated[list[str], Field(max_length=MAX_PROMPTS_PER_REQUEST, fail_fast=True)]
)


def reject_removed_pooling_parameters(data: Any) -> Any:
    """Upstream v0.28's refusals of fields it removed (before validation)."""
    if not isinstance(data, dict):
        return data
    if "normalize" in data:
        raise VLLMValidationError(
            "Parameter `normalize` was removed; use `use_activation` instead.",
            parameter="normalize",
        )
    check_removed_pooling_task(data.get("task"))
    return data


class PoolingBasicRequestMixin(OpenAIBaseModel):
    model: str | None = None
    user: str | None = None
    # -1: max_model_len tokens; k: k tokens (see truncation_side).
    truncate_prompt_tokens: StrictInt | None = Field(None, ge=-1)
    # "right" keeps the first tokens, "left" the last; None: the tokenizer's side.
    truncation_side: Literal["left", "right"] | None = None
    priority: Int64 = 0

    @model_validator(mode="before")
    @classmethod
    def _reject_removed(cls, data: Any) -> Any:
        return reject_removed_pooling_parameters(data)


class CompletionRequestMixin(OpenAIBaseModel):
    input: PoolingInput
    add_special_tokens: StrictBool = True


class ChatRequestOptionsMixin(OpenAIBaseModel):
    add_generation_prompt: StrictBool = False
    continue_final_message: StrictBool = False
    # The chat template adds the special tokens it wants.
    add_special_tokens: StrictBool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # Multimodal inputs are not built: refused when given.
    media_io_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_chat_options(self) -> ChatRequestOptionsMixin:
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
            )
        for name in ("media_io_kwargs", "mm_processor_kwargs"):
            if getattr(self, name) is not None:
                raise ValueError(f"`{name}` is not supported: multimodal inputs are not built.")
        return self


class ChatRequestMixin(ChatRequestOptionsMixin):
    messages: Annotated[
        list[ChatMessageParam], Field(min_length=1, max_length=MAX_PROMPTS_PER_REQUEST)
    ]


class EncodingRequestMixin(OpenAIBaseModel):
    encoding_format: EncodingFormat = "float"
    # base64 / bytes only: the dtype and byte order of the written values.
    embed_dtype: EmbedDType = "float32"
    endianness: Endianness = "native"


class EmbedRequestMixin(EncodingRequestMixin):
    # Matryoshka models only (PoolingParams.verify refuses it otherwise).
    dimensions: StrictInt | None = None
    # For embeddings: L2-normalize (None: the pooler config's default, True).
    use_activation: StrictBool | None = None


class ClassifyRequestMixin(OpenAIBaseModel):
    # None: the pooler config's default (apply the activation).
    use_activation: StrictBool | None = None
