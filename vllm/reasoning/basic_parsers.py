"""The shared machinery of the built-in reasoning parsers.

Upstream: vllm/reasoning/basic_parsers.py (`BaseThinkingReasoningParser`).

Every built-in parser here is one pure function, `_split(text, final)`:
the text of the output so far -> (reasoning, content). Both entry points
derive from it, so they cannot disagree:

    extract_reasoning(text)           = _split(text, final=True)
    extract_reasoning_streaming(...)  = _split(current, final=False)
                                        minus _split(previous, final=False)

With `final=False` a split holds back what is still undecided: a tail that
may be the beginning of a marker ("</thi" could become "</think>"), or
leading whitespace that may precede a start marker. It must be monotone:
for a text p and any extension q of it, each part of the split of p is a
prefix of the same part of q, so a streamed delta never has to be taken
back. What is still held when the output ends comes out of
`extract_reasoning_streaming_final`.

Markers are matched in the decoded text (the detokenizer keeps them when
they are not special tokens, or when special tokens are not skipped); token
ids are used where the tokenizer has the marker as one token
(`is_reasoning_end` and `extract_content_ids`, which see ids only), and the
text is decoded otherwise, so a tokenizer without the marker tokens works
the same.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vllm.entrypoints.openai.protocol_responses import DeltaMessage
from vllm.reasoning.abs_reasoning_parsers import ReasoningParser

if TYPE_CHECKING:
    from vllm.tokenizers.protocol import TokenizerLike

# Tokens decoded around the newest ones when a marker is looked for in the
# text (tokenizers without the marker as one token spell it in pieces; a
# marker of a dozen characters is at most this many byte-level tokens).
MARKER_WINDOW_TOKENS = 32


def held_marker_prefix(text: str, markers: Sequence[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of one of
    `markers` (0 if none): the part a stream must hold back."""
    longest = max((len(m) for m in markers), default=1) - 1
    for k in range(min(len(text), longest), 0, -1):
        tail = text[-k:]
        if any(len(m) > k and m.startswith(tail) for m in markers):
            return k
    return 0


def hold_back(text: str, markers: Sequence[str]) -> str:
    """`text` without its tail that may still become one of `markers`."""
    return text[: len(text) - held_marker_prefix(text, markers)]


def delta_between(
    before: tuple[str | None, str | None], after: tuple[str | None, str | None]
) -> DeltaMessage | None:
    """The DeltaMessage taking split `before` to split `after` (None parts
    count as empty), or None when nothing was added."""
    parts = []
    for old, new in zip(before, after):
        old, new = old or "", new or ""
        # Monotone splits make `old` a prefix of `new` (tests/reasoning checks it).
        parts.append(new[len(old) :] if new.startswith(old) else "")
    reasoning, content = parts
    if not reasoning and not content:
        return None
    return DeltaMessage(reasoning=reasoning or None, content=content or None)


class TextSplitReasoningParser(ReasoningParser):
    """A reasoning parser defined by `_split`; the text entry points and the
    end-of-stream release come from it (see the module docstring)."""

    @abstractmethod
    def _split(self, text: str, final: bool) -> tuple[str | None, str | None]:
        """(reasoning, content) of `text`; with `final=False`, without what
        is still undecided. Must be monotone in `text`."""

    def extract_reasoning(self, model_output: str, request: Any) -> tuple[str | None, str | None]:
        return self._split(model_output, final=True)

    def extract_reasoning_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
    ) -> DeltaMessage | None:
        # A function of the two texts only (the cache just saves re-splitting
        # the previous text, which was the current one a step ago).
        return delta_between(self._stream_split(previous_text), self._stream_split(current_text))

    def _stream_split(self, text: str) -> tuple[str | None, str | None]:
        cached: tuple[str, tuple[str | None, str | None]] | None = getattr(
            self, "_last_stream_split", None
        )
        if cached is not None and cached[0] == text:
            return cached[1]
        split = self._split(text, final=False)
        self._last_stream_split = (text, split)
        return split

    def extract_reasoning_streaming_final(self, model_output: str) -> DeltaMessage | None:
        return delta_between(
            self._split(model_output, final=False), self._split(model_output, final=True)
        )

    # ---- token-id helpers --------------------------------------------------------
    def _decode(self, ids: Sequence[int]) -> str:
        return self.model_tokenizer.decode(list(ids), skip_special_tokens=False)

    def _index_completing(self, ids: Sequence[int], marker: str, token_id: int | None) -> int:
        """Index of the token that completes the first `marker` in `ids`
        (the token itself, or the last of its pieces), or -1."""
        if token_id is not None:
            return list(ids).index(token_id) if token_id in ids else -1
        if marker not in self._decode(ids):
            return -1
        lo, hi = 0, len(ids) - 1  # the shortest prefix whose text has it
        while lo < hi:
            mid = (lo + hi) // 2
            if marker in self._decode(ids[: mid + 1]):
                hi = mid
            else:
                lo = mid + 1
        return lo


class BaseThinkingReasoningParser(TextSplitReasoningParser):
    """Reasoning between a start and an end marker (`<think>...</think>`).

    The start marker is optional (chat templates often put it in the
    prompt): everything before the end marker is reasoning, everything after
    it content. Whitespace before a leading start marker is dropped; a start
    marker later in the reasoning is removed once. Without an end marker the
    whole output is reasoning (it was cut off while thinking).
    """

    @property
    @abstractmethod
    def start_token(self) -> str:
        """The marker that starts the reasoning."""

    @property
    @abstractmethod
    def end_token(self) -> str:
        """The marker that ends the reasoning."""

    def __init__(self, tokenizer: TokenizerLike, *args: Any, **kwargs: Any) -> None:
        super().__init__(tokenizer, *args, **kwargs)
        if not self.model_tokenizer:
            raise ValueError(
                "The model tokenizer must be passed to the ReasoningParser constructor."
            )
        if not self.start_token or not self.end_token:
            raise ValueError("start_token and end_token must be defined in subclasses")
        # None: the tokenizer spells the marker in pieces; it is found in text.
        self.start_token_id: int | None = self.vocab.get(self.start_token)
        self.end_token_id: int | None = self.vocab.get(self.end_token)

    # ---- ids ---------------------------------------------------------------------
    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        """Whether the last marker in `input_ids` is the end marker."""
        if self.start_token_id is not None and self.end_token_id is not None:
            for token_id in reversed(input_ids):
                if token_id == self.start_token_id:
                    return False
                if token_id == self.end_token_id:
                    return True
            return False
        text = self._decode(input_ids)
        return text.rfind(self.end_token) > text.rfind(self.start_token)

    def is_reasoning_end_streaming(
        self, input_ids: Sequence[int], delta_ids: Sequence[int]
    ) -> bool:
        """Whether the reasoning ended with the newest tokens `delta_ids`
        (the last of `input_ids`); looks at a short window only."""
        if self.end_token_id is not None:
            return self.end_token_id in delta_ids and self.is_reasoning_end(input_ids)
        window = list(input_ids[-(len(delta_ids) + MARKER_WINDOW_TOKENS) :])
        return self.is_reasoning_end(window)

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        """The ids after the first end marker ([] when the end marker is the
        last token, or missing)."""
        end = self._index_completing(input_ids, self.end_token, self.end_token_id)
        if end < 0 or end == len(input_ids) - 1:
            return []
        return input_ids[end + 1 :]

    # ---- text --------------------------------------------------------------------
    def _split(self, text: str, final: bool) -> tuple[str | None, str | None]:
        start, end = self.start_token, self.end_token
        rest = text.lstrip()
        if not final and len(rest) < len(start) and start.startswith(rest):
            # Only whitespace and perhaps a partial start marker so far.
            return "", None
        start_seen = rest.startswith(start)
        body = rest[len(start) :] if start_seen else text
        end_index = body.find(end)
        reasoning = body if end_index < 0 else body[:end_index]
        if not start_seen and start in reasoning:
            reasoning = reasoning.replace(start, "", 1)
            start_seen = True
        if end_index >= 0:
            return reasoning, body[end_index + len(end) :] or None
        if final:
            return reasoning, None
        return hold_back(reasoning, [end] if start_seen else [end, start]), None
