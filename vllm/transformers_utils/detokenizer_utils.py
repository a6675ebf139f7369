"""Incremental detokenization for tokenizers without a Rust `DecodeStream`.

Upstream: vllm/transformers_utils/detokenizer_utils.py. The text of token i
depends on its neighbours (leading-space markers, multi-byte characters split
over byte-fallback tokens), so each step decodes a short window twice:

    tokens:  ... | prefix_offset ........ read_offset | new token(s) |
    prefix_text = decode(tokens[prefix_offset:read_offset])   (already emitted)
    new_text    = decode(tokens[prefix_offset:])

and emits `new_text[len(prefix_text):]`. When the window ends in U+FFFD (a
UTF-8 character not yet complete) nothing is emitted and the offsets stay,
so the character comes out whole once its last byte arrives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.tokenizers import TokenizerLike

# How many prompt tokens seed the window, so the first generated token is
# decoded with its left context (e.g. "▁Paris" after a word becomes " Paris").
INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET = 5


def convert_prompt_ids_to_tokens(
    tokenizer: TokenizerLike, prompt_ids: list[int], skip_special_tokens: bool = False
) -> tuple[list[str], int, int]:
    """Tokens of the prompt's tail and the (prefix_offset, read_offset) to start from."""
    tail = prompt_ids[-INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET - 2 :]
    tokens = _ids_to_tokens(tokenizer, tail, skip_special_tokens)
    prefix_offset = max(len(tokens) - INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET, 0)
    return tokens, prefix_offset, len(tokens)


def detokenize_incrementally(
    tokenizer: TokenizerLike,
    all_input_ids: list[int],
    prev_tokens: list[str],
    prefix_offset: int,
    read_offset: int,
    skip_special_tokens: bool = False,
    spaces_between_special_tokens: bool = True,
) -> tuple[list[str], str, int, int]:
    """Decode the last id of `all_input_ids` given the tokens before it.

    Returns (new_tokens, new_text, new_prefix_offset, new_read_offset); the
    caller appends new_tokens to prev_tokens.
    """
    new_tokens = _ids_to_tokens(tokenizer, all_input_ids[-1:], skip_special_tokens)
    output_tokens = prev_tokens + new_tokens
    prefix_text = _tokens_to_string(
        tokenizer,
        output_tokens[prefix_offset:read_offset],
        skip_special_tokens,
        spaces_between_special_tokens,
    )
    new_text = _tokens_to_string(
        tokenizer, output_tokens[prefix_offset:], skip_special_tokens, spaces_between_special_tokens
    )
    if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
        # Incomplete character (or nothing new yet): hold the text back.
        return new_tokens, "", prefix_offset, read_offset
    return new_tokens, new_text[len(prefix_text) :], read_offset, len(output_tokens)


def _ids_to_tokens(
    tokenizer: TokenizerLike, ids: list[int], skip_special_tokens: bool
) -> list[str]:
    tokens = tokenizer.convert_ids_to_tokens(ids, skip_special_tokens=skip_special_tokens)
    # Ids the tokenizer does not know come back as None; they decode to nothing.
    return [t if t is not None else "" for t in tokens]


def _tokens_to_string(
    tokenizer: TokenizerLike,
    tokens: list[str],
    skip_special_tokens: bool,
    spaces_between_special_tokens: bool,
) -> str:
    """Decode tokens, keeping added (special) tokens verbatim as HF's slow decode does."""
    added = tokenizer.get_added_vocab()
    if not added:
        return tokenizer.convert_tokens_to_string(tokens)
    special = set(tokenizer.all_special_tokens)
    pieces: list[str] = []
    run: list[str] = []
    for token in tokens:
        if skip_special_tokens and token in special:
            continue
        if token in added:
            if run:
                pieces.append(tokenizer.convert_tokens_to_string(run))
                run = []
            pieces.append(token)
        else:
            run.append(token)
    if run:
        pieces.append(tokenizer.convert_tokens_to_string(run))
    return (" " if spaces_between_special_tokens else "").join(pieces)
