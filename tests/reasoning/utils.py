"""Shared parts of the reasoning-parser tests: small real tokenizers (built
here, no downloads) and a streaming driver that feeds a parser the deltas a
server would, token by token or in chunks of several tokens."""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Sequence

from tests.utils import make_tiny_tokenizer
from vllm.reasoning import ReasoningParser, ReasoningParserManager

# Marker tokens added to the tokenizer of each family (Mistral's are special
# tokens, as in its tokenizer; the others plain added tokens, as in DeepSeek's
# and Qwen's).
THINK_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
MISTRAL_TOKENS = ["[THINK]", "[/THINK]"]


@functools.cache
def plain_tokenizer():
    """Byte-level BPE without any marker token: markers are spelled in pieces."""
    return make_tiny_tokenizer(tempfile.mkdtemp(prefix="reasoning-tok-"))


@functools.cache
def marker_tokenizer():
    """The same BPE with the think, tool-call and [THINK] markers as single tokens."""
    tok = make_tiny_tokenizer(tempfile.mkdtemp(prefix="reasoning-tok-"))
    tok.add_tokens(THINK_TOKENS)
    tok.add_special_tokens({"additional_special_tokens": MISTRAL_TOKENS})
    return tok


TOKENIZERS = {"markers": marker_tokenizer, "plain": plain_tokenizer}


def make_parser(name: str, tokenizer, **kwargs) -> ReasoningParser:
    return ReasoningParserManager.get_reasoning_parser(name)(tokenizer, **kwargs)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def text_deltas(tokenizer, ids: Sequence[int], cuts: Sequence[int]) -> list[tuple[str, list[int]]]:
    """(delta_text, delta_ids) per chunk of `ids` ending at each of `cuts`, as
    an incremental detokenizer gives them: a cut inside a multi-byte
    character waits for the rest of it."""
    deltas: list[tuple[str, list[int]]] = []
    sent_text, sent_ids = "", 0
    for cut in [*cuts, len(ids)]:
        text = tokenizer.decode(list(ids[:cut]), skip_special_tokens=False)
        if cut < len(ids) and text.endswith("\ufffd"):
            continue
        if cut > sent_ids:
            assert text.startswith(sent_text), (sent_text, text)
            deltas.append((text[len(sent_text) :], list(ids[sent_ids:cut])))
            sent_text, sent_ids = text, cut
    return deltas


def stream(
    parser: ReasoningParser, deltas: Sequence[tuple[str, Sequence[int]]], finish: bool = True
) -> tuple[str, str]:
    """Feed `deltas` to the streaming entry point; the concatenated
    (reasoning, content) it returned, with the end-of-stream release when
    `finish`."""
    reasoning, content = [], []
    previous_text, previous_ids = "", []
    for delta_text, delta_ids in deltas:
        current_text, current_ids = previous_text + delta_text, [*previous_ids, *delta_ids]
        message = parser.extract_reasoning_streaming(
            previous_text, current_text, delta_text, previous_ids, current_ids, list(delta_ids)
        )
        if message is not None:
            assert message.reasoning or message.content, "an empty DeltaMessage"
            reasoning.append(message.reasoning or "")
            content.append(message.content or "")
        previous_text, previous_ids = current_text, current_ids
    if finish:
        message = parser.extract_reasoning_streaming_final(previous_text)
        if message is not None:
            reasoning.append(message.reasoning or "")
            content.append(message.content or "")
    return "".join(reasoning), "".join(content)


def stream_tokens(parser: ReasoningParser, tokenizer, text: str) -> tuple[str, str]:
    """`text` streamed one token at a time."""
    ids = encode(tokenizer, text)
    return stream(parser, text_deltas(tokenizer, ids, range(1, len(ids))))
