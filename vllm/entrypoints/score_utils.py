"""Scoring helpers shared by `LLM.score` and the server's `/score` and
`/rerank` (upstream v0.28 keeps them in vllm/entrypoints/pooling/scoring/
utils.py and io_processor.py; here they stay importable by the offline `LLM`
without the server's modules).

Score inputs pair `data_1` with `data_2`: 1:1, 1:N (one query against many
documents) or N:N. A cross-encoder (a classifier with one label) reads each
pair as one prompt: the tokenizer's text / text_pair encoding, truncated by
the tokenizer (`truncation=True, max_length=k`: longest segment first,
special tokens kept), and, for BERT-style models, the position where
token_type_ids turn from 0 to 1 sent to the model as
`extra_kwargs["compressed_token_type_ids"]`. A bi-encoder (an embedding
model) embeds every text and scores a pair by the cosine similarity of its
two embeddings. `max_tokens_per_query` / `max_tokens_per_doc` cut each
query / document text to that many content tokens first (at a character
boundary from the tokenizer's offsets, so no decode round trip).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch

from vllm.exceptions import VLLMValidationError
from vllm.inputs import TokensPrompt
from vllm.outputs import PoolingOutput, PoolingRequestOutput, ScoringRequestOutput
from vllm.pooling_params import PoolingParams

if TYPE_CHECKING:
    from vllm.config.model import ModelConfig
    from vllm.tokenizers import TokenizerLike

ScoreData = str | TokensPrompt


def _validate_score_input_lens(data_1: list[Any], data_2: list[Any]) -> None:
    len_1, len_2 = len(data_1), len(data_2)
    if len_1 > 1 and len_1 != len_2:
        raise VLLMValidationError("Input lengths must be either 1:1, 1:N or N:N")
    if len_1 == 0:
        raise VLLMValidationError("At least one text element must be given")
    if len_2 == 0:
        raise VLLMValidationError("At least one text_pair element must be given")


def as_list(data: Any) -> list[Any]:
    """A single str / prompt dict as a one-element list; a list as is."""
    if isinstance(data, (str, dict)):
        return [data]
    return list(data)


def score_input_lists(data_1: Any, data_2: Any) -> tuple[list[Any], list[Any]]:
    """Both sides as lists, checked to pair 1:1, 1:N or N:N (not broadcast:
    a bi-encoder embeds a single data_1 once)."""
    list_1, list_2 = as_list(data_1), as_list(data_2)
    _validate_score_input_lens(list_1, list_2)
    return list_1, list_2


def check_cross_encoder(model_config: ModelConfig) -> None:
    """A cross-encoder scores with its one label's logit."""
    if getattr(model_config.hf_config, "num_labels", 0) != 1:
        raise ValueError("Scoring API is only enabled for num_labels == 1.")


def check_token_limit(value: int, name: str, max_model_len: int) -> int:
    """`max_tokens_per_query` / `max_tokens_per_doc`: 0 (off) or below the
    context length (upstream's messages)."""
    if value < 0:
        raise VLLMValidationError(f"{name} must be a non-negative integer", parameter=name)
    if value >= max_model_len:
        raise VLLMValidationError(
            f"{name} ({value}) must be less than max_model_len ({max_model_len}).",
            parameter=name,
        )
    return value


def truncate_text_to_tokens(text: str, tokenizer: TokenizerLike, max_tokens: int) -> str:
    """The text's first `max_tokens` content tokens, cut at the character
    where the last kept token ends (offset_mapping: [start, end) per token)."""
    encoding = cast(Any, tokenizer)(text, add_special_tokens=False, return_offsets_mapping=True)
    if len(encoding["input_ids"]) <= max_tokens:
        return text
    return text[: encoding["offset_mapping"][max_tokens - 1][1]]


_Data = TypeVar("_Data", str, ScoreData)


def truncate_score_data(
    items: list[_Data], tokenizer: TokenizerLike, max_tokens: int
) -> list[_Data]:
    """Each text cut to `max_tokens` content tokens (0: unchanged; token
    prompts as they are)."""
    if max_tokens <= 0:
        return items
    return [
        cast(_Data, truncate_text_to_tokens(d, tokenizer, max_tokens)) if isinstance(d, str) else d
        for d in items
    ]


def get_num_special_tokens_for_pair(tokenizer: TokenizerLike) -> int:
    """How many special tokens the tokenizer adds around a pair."""
    method = getattr(tokenizer, "num_special_tokens_to_add", None)
    if method is not None:
        return int(method(pair=True))
    empty = cast(Any, tokenizer)("", text_pair="", add_special_tokens=True)
    return len(empty["input_ids"])


def score_tokenization_kwargs(
    keep: int | None,
    max_model_len: int,
    tokenization_kwargs: dict[str, Any] | None = None,
    *,
    side: str | None = None,
) -> dict[str, Any]:
    """Tokenizer kwargs of a pair. `keep` k (a checked truncate_prompt_tokens):
    the tokenizer's own truncation to k tokens, or, with a truncation `side`,
    the whole pair (cut on that side by cross_encoder_request). None: stop
    at max_model_len + 1 tokens (enough to refuse an over-long pair without
    tokenizing all of it) unless the caller set max_length."""
    kwargs = dict(tokenization_kwargs or {})
    if keep is None:
        if "max_length" not in kwargs:
            kwargs.setdefault("truncation", True)
            kwargs["max_length"] = max_model_len + 1
    elif side is None:
        kwargs.update(truncation=True, max_length=keep)
    else:
        kwargs.update(truncation=False)
    return kwargs


def compress_token_type_ids(token_type_ids: list[int]) -> int:
    """Where a pair's token_type_ids turn from 0 to 1 (their length if they
    never do); anything but zeros then ones is refused."""
    first_one = len(token_type_ids)
    for i, type_id in enumerate(token_type_ids):
        if type_id > 1 or (type_id == 0 and first_one < i):
            raise ValueError(
                "Token type ids are expected to be a sequence of zeros followed by a "
                "sequence of ones"
            )
        if type_id == 1 and first_one > i:
            first_one = i
    return first_one


def cross_encoder_request(
    tokenizer: TokenizerLike,
    data_1: ScoreData,
    data_2: ScoreData,
    params: PoolingParams,
    tokenization_kwargs: dict[str, Any] | None = None,
    *,
    max_tokens_per_doc: int = 0,
    keep: int | None = None,
    side: str | None = None,
) -> tuple[TokensPrompt, PoolingParams]:
    """One pair's engine prompt and its params: where token_type_ids turn 1
    (BERT-style pairs) travels as extra_kwargs["compressed_token_type_ids"].
    With a truncation `side`, the encoded pair (and its token_type_ids)
    keeps its first ("right") or last ("left") `keep` tokens."""
    prompt, token_type_ids = get_score_prompt(
        tokenizer, data_1, data_2, tokenization_kwargs, max_tokens_per_doc=max_tokens_per_doc
    )
    ids = prompt["prompt_token_ids"]
    if side is not None and keep is not None and len(ids) > keep:
        cut = slice(len(ids) - keep, None) if side == "left" else slice(0, keep)
        prompt = TokensPrompt(prompt_token_ids=ids[cut])
        token_type_ids = None if token_type_ids is None else token_type_ids[cut]
    params = params.clone()
    if token_type_ids:
        params.extra_kwargs = {
            **(params.extra_kwargs or {}),
            "compressed_token_type_ids": compress_token_type_ids(token_type_ids),
        }
    return prompt, params


def _cosine_similarity(
    tokenizer: TokenizerLike | None,
    embed_1: list[PoolingRequestOutput],
    embed_2: list[PoolingRequestOutput],
) -> list[ScoringRequestOutput]:
    """One ScoringRequestOutput per pair: cosine of the two embeddings; its
    tokens (the usage) are the two texts' with one pad token between."""
    scores: list[ScoringRequestOutput] = []
    for emb_1, emb_2 in zip(embed_1, embed_2):
        a = emb_1.outputs.data.float()
        b = emb_2.outputs.data.float()
        pair_score = torch.nn.functional.cosine_similarity(a, b, dim=0)
        pad = getattr(tokenizer, "pad_token_id", None)
        tokens = list(emb_1.prompt_token_ids)
        if pad is not None:
            tokens.append(pad)
        tokens += emb_2.prompt_token_ids
        scores.append(
            ScoringRequestOutput.from_base(
                PoolingRequestOutput(
                    request_id=f"{emb_1.request_id}_{emb_2.request_id}",
                    outputs=PoolingOutput(data=pair_score),
                    prompt_token_ids=tokens,
                    finished=True,
                )
            )
        )
    return scores


def _text(data: ScoreData, tokenizer: TokenizerLike) -> str:
    if isinstance(data, str):
        return data
    if "prompt_token_ids" in data:
        return tokenizer.decode(list(data["prompt_token_ids"]))
    raise ValueError(f"A score input must be a str or a TokensPrompt, got {data!r}")


def get_score_prompt(
    tokenizer: TokenizerLike,
    data_1: ScoreData,
    data_2: ScoreData,
    tokenization_kwargs: dict[str, Any] | None = None,
    *,
    max_tokens_per_doc: int = 0,
) -> tuple[TokensPrompt, list[int] | None]:
    """A cross-encoder's prompt for one pair: the tokenizer's text / text_pair
    encoding (with its special tokens) and its token_type_ids when the
    tokenizer makes them. With `max_tokens_per_doc`, only the document is
    truncated, to the query's tokens + that many + the pair's special tokens
    (or the given max_length when smaller, as upstream)."""
    text_1, text_2 = _text(data_1, tokenizer), _text(data_2, tokenizer)
    kwargs = dict(tokenization_kwargs or {})
    if max_tokens_per_doc > 0:
        n_fixed = len(tokenizer.encode(text_1, add_special_tokens=False))
        n_fixed += get_num_special_tokens_for_pair(tokenizer)
        limit = n_fixed + max_tokens_per_doc
        given = kwargs.get("max_length")
        limit = limit if given is None else min(limit, given)
        # only_second cannot cut below the query: leave that to the
        # longest-first truncation asked for.
        if limit > n_fixed:
            kwargs.update(truncation="only_second", max_length=limit)
    encoded = cast(Any, tokenizer)(text=text_1, text_pair=text_2, **kwargs)
    type_ids = encoded.get("token_type_ids")
    prompt = TokensPrompt(prompt_token_ids=list(encoded["input_ids"]))
    return prompt, None if type_ids is None else list(type_ids)
