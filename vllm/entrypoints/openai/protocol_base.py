"""The base of every OpenAI-API body, its error envelope and the strict
scalar types of the request fields (re-exported by
vllm/entrypoints/openai/protocol.py, upstream's single protocol module).

Requests accept unknown fields (OpenAI clients send new ones all the time)
but, as upstream, log which ones were ignored. Scalars are strict where a
client's mistake would otherwise be read as something else: a string or a
number is not a boolean (`"stream": "false"` would be true to pydantic's lax
mode), a string or a float is not an integer, a string is not a number.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator

from vllm.logger import init_logger

logger = init_logger(__name__)

# Upstream's VLLM_MAX_N_SEQUENCES: the largest `n` a request may ask for.
MAX_N_SEQUENCES = 16384
# Most prompts one completion request may batch.
MAX_PROMPTS_PER_REQUEST = 1024
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# Logprobs of -inf do not survive JSON: report this floor instead.
LOGPROB_FLOOR = -9999.0
# The ignored-fields warning names at most this many fields, each cut to this
# many characters: a hostile body's keys must not flood the log.
_MAX_LOGGED_FIELDS = 16
_MAX_LOGGED_NAME_CHARS = 64

# Strict scalars (JSON true/false, integers, numbers) for request fields.
StrictBool = Annotated[bool, Strict()]
StrictInt = Annotated[int, Strict()]
# A float field takes a JSON integer too (as JSON has one number type), never a string.
StrictFloat = Annotated[float, Strict()]
Int64 = Annotated[int, Strict(), Field(ge=_INT64_MIN, le=_INT64_MAX)]
TokenId = Annotated[int, Strict(), Field(ge=0)]


class OpenAIBaseModel(BaseModel):
    # Clients send fields this server does not know: accept them, log them.
    model_config = ConfigDict(extra="allow")

    # False where unknown keys are used rather than ignored (chat messages:
    # every key reaches the chat template).
    log_extra_fields: ClassVar[bool] = True

    @model_validator(mode="wrap")
    @classmethod
    def __log_extra_fields__(cls, data: Any, handler: Any) -> Any:
        result = handler(data)
        if cls.log_extra_fields and isinstance(data, dict):
            log_ignored_fields([k for k in data if k not in _known_field_names(cls)])
        return result


def log_ignored_fields(names: list[Any]) -> None:
    """Upstream's warning for request fields nothing reads."""
    if names:
        logger.warning(
            "The following fields were present in the request but ignored: %s",
            _bounded_names(names),
        )


def _known_field_names(cls: type[BaseModel]) -> frozenset[str]:
    """Field names and aliases of `cls` (per class: a subclass has more)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = frozenset(
            [*cls.model_fields, *(f.alias for f in cls.model_fields.values() if f.alias)]
        )
        _FIELD_NAMES[cls] = names
    return names


_FIELD_NAMES: dict[type[BaseModel], frozenset[str]] = {}


def _bounded_names(names: list[Any]) -> set[str]:
    shown = {str(k)[:_MAX_LOGGED_NAME_CHARS] for k in names[:_MAX_LOGGED_FIELDS]}
    if len(names) > _MAX_LOGGED_FIELDS:
        shown.add(f"... ({len(names) - _MAX_LOGGED_FIELDS} more)")
    return shown


class ErrorInfo(OpenAIBaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(OpenAIBaseModel):
    error: ErrorInfo


class PromptTokenUsageInfo(OpenAIBaseModel):
    cached_tokens: int | None = None


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: PromptTokenUsageInfo | None = None
