"""Scoring helpers shared by `LLM.score` and the server's `/score` and
`/rerank` (upstream: vllm/entrypoints/score_utils.py).

Score inputs pair `data_1` with `data_2`: 1:1, 1:N (one query against many
documents) or N:N. A cross-encoder (a classifier with one label) reads each
pair as one prompt (the tokenizer's text / text_pair encoding, truncated by
the tokenizer when asked); a bi-encoder (an embedding model) embeds every
text and scores a pair by the cosine similarity of its two embeddings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

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
        raise ValueError("Input lengths must be either 1:1, 1:N or N:N")
    if len_1 == 0:
        raise ValueError("At least one text element must be given")
    if len_2 == 0:
        raise ValueError("At least one text_pair element must be given")


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
    num_labels = int(getattr(model_config.hf_config, "num_labels", 1) or 1)
    if num_labels != 1:
        raise ValueError("Scoring API is only enabled for num_labels == 1.")


def score_tokenization_kwargs(
    truncate_prompt_tokens: int | None,
    max_model_len: int,
    tokenization_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Tokenizer kwargs of a pair: `truncate_prompt_tokens` (-1: the context)
    becomes the tokenizer's own truncation (longest segment first, special
    tokens kept), not a cut of the encoded pair that would lose [CLS]."""
    kwargs = dict(tokenization_kwargs or {})
    if truncate_prompt_tokens is None:
        return kwargs
    keep = max_model_len if truncate_prompt_tokens == -1 else truncate_prompt_tokens
    if keep > max_model_len:
        raise VLLMValidationError(
            f"truncate_prompt_tokens value ({keep}) is greater than max_model_len "
            f"({max_model_len}). Please, select a smaller truncation size.",
            parameter="truncate_prompt_tokens",
        )
    kwargs.update(truncation=True, max_length=keep)
    return kwargs


def cross_encoder_request(
    tokenizer: TokenizerLike,
    data_1: ScoreData,
    data_2: ScoreData,
    params: PoolingParams,
    tokenization_kwargs: dict[str, Any] | None = None,
) -> tuple[TokensPrompt, PoolingParams]:
    """One pair's engine prompt and its params: where token_type_ids turn 1
    (BERT-style pairs) travels as extra_kwargs["compressed_token_type_ids"]."""
    prompt, second_segment = get_score_prompt(tokenizer, data_1, data_2, tokenization_kwargs)
    params = params.clone()
    if second_segment is not None:
        params.extra_kwargs = {"compressed_token_type_ids": second_segment}
    return prompt, params


def _cosine_similarity(
    tokenizer: TokenizerLike | None,
    embed_1: list[PoolingRequestOutput],
    embed_2: list[PoolingRequestOutput],
) -> list[ScoringRequestOutput]:
    """One ScoringRequestOutput per pair: cosine of the two embeddings."""
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
) -> tuple[TokensPrompt, int | None]:
    """A cross-encoder's prompt for one pair: the tokenizer's text / text_pair
    encoding (with its special tokens), and where the second segment starts
    when the tokenizer marks it with token_type_ids (None otherwise)."""
    encoded = cast(Any, tokenizer)(
        text=_text(data_1, tokenizer),
        text_pair=_text(data_2, tokenizer),
        **(tokenization_kwargs or {}),
    )
    ids = list(encoded["input_ids"])
    type_ids = encoded.get("token_type_ids")
    second = None
    if type_ids is not None and 1 in list(type_ids):
        second = list(type_ids).index(1)
    return TokensPrompt(prompt_token_ids=ids), second
