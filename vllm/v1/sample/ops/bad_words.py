"""Bad words (upstream: vllm/v1/sample/ops/bad_words.py).

A bad word is a token sequence [t_0, ..., t_k]. Its last token t_k is
forbidden at the next position exactly when the request's last k output
tokens are t_0 .. t_{k-1} (a one-token word is always forbidden). Only the
last token of a word is ever masked: the prefix may be generated freely, the
word just cannot be completed. The prompt is not part of the history, as
upstream.
"""

from __future__ import annotations

import torch

_SMALLEST_LOGIT = float("-inf")


def banned_tokens(bad_words_token_ids: list[list[int]], past_tokens_ids: list[int]) -> list[int]:
    """The last tokens of the words whose prefix ends `past_tokens_ids`."""
    banned = []
    for word in bad_words_token_ids:
        prefix_len = len(word) - 1
        if prefix_len > len(past_tokens_ids):
            continue
        if prefix_len == 0 or past_tokens_ids[-prefix_len:] == word[:-1]:
            banned.append(word[-1])
    return banned


def apply_bad_words(
    logits: torch.Tensor,
    bad_words_token_ids: dict[int, list[list[int]]],
    past_tokens_ids: list[list[int]],
) -> None:
    """Mask the banned tokens of every row, in place, with one index_put_.

    bad_words_token_ids: row -> that request's words; past_tokens_ids: the
    output tokens of each row.
    """
    rows: list[int] = []
    cols: list[int] = []
    vocab_size = logits.shape[-1]
    for row, words in bad_words_token_ids.items():
        for token in banned_tokens(words, past_tokens_ids[row]):
            if 0 <= token < vocab_size:
                rows.append(row)
                cols.append(token)
    if rows:
        index = (torch.tensor(rows, device=logits.device), torch.tensor(cols, device=logits.device))
        logits.index_put_(
            index, torch.tensor(_SMALLEST_LOGIT, device=logits.device, dtype=logits.dtype)
        )
