"""Incremental detokenization and stop strings (upstream: vllm/v1/engine/detokenizer.py).

One detokenizer per request, fed the request's new token ids each step. It
keeps the output text, finds stop strings (which may span token boundaries)
and decides how much text a streamed (DELTA) output may show yet:

* A UTF-8 character split over several byte tokens is never emitted half
  done: the fast path's `DecodeStream` and the slow path's U+FFFD check both
  hold the text back until the character completes.
* With stop strings that are not to be shown, the last `max(len(stop)) - 1`
  characters are held back until the request finishes, since they may be
  the start of a stop string.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from bisect import bisect_left
from typing import TYPE_CHECKING

from vllm.logger import init_logger
from vllm.transformers_utils.detokenizer_utils import (
    convert_prompt_ids_to_tokens,
    detokenize_incrementally,
)
from vllm.v1.engine import EngineCoreRequest

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from tokenizers.decoders import DecodeStream

    from vllm.tokenizers import TokenizerLike

logger = init_logger(__name__)

# The tokenizers library's error when a DecodeStream's state goes bad.
INVALID_PREFIX_ERR_MSG = "Invalid prefix encountered"


class IncrementalDetokenizer:
    """The no-tokenizer detokenizer: tracks token ids, produces no text."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids

    def num_output_tokens(self) -> int:
        return len(self.token_ids)

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """Take this step's tokens; return the stop string they completed, if any."""
        self.token_ids.extend(new_token_ids)
        return None

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """The text to show: all so far, or (delta) only what is new since the last call."""
        return ""

    @classmethod
    def from_new_request(
        cls, tokenizer: TokenizerLike | None, request: EngineCoreRequest
    ) -> IncrementalDetokenizer:
        if tokenizer is None:
            return IncrementalDetokenizer()
        if _fast_backend(tokenizer) is not None:
            return FastIncrementalDetokenizer(tokenizer, request)
        return SlowIncrementalDetokenizer(tokenizer, request)


def _fast_backend(tokenizer: TokenizerLike) -> Tokenizer | None:
    """The Rust `tokenizers.Tokenizer` of a Hugging Face fast tokenizer (its
    public `backend_tokenizer`), or None for a Python-only tokenizer."""
    from tokenizers import Tokenizer

    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend if isinstance(backend, Tokenizer) else None


class BaseIncrementalDetokenizer(IncrementalDetokenizer, ABC):
    """Text accumulation, stop strings and streaming hold-back; subclasses decode."""

    def __init__(self, request: EngineCoreRequest) -> None:
        super().__init__()
        params = request.sampling_params
        assert params is not None
        stop = params.stop or []
        self.stop: list[str] = [stop] if isinstance(stop, str) else list(stop)
        self.min_tokens = params.min_tokens
        self.include_stop_str_in_output = params.include_stop_str_in_output
        # A hidden stop string may be starting in the last len-1 characters.
        self.stop_buffer_length = (
            max(len(s) for s in self.stop) - 1
            if self.stop and not self.include_stop_str_in_output
            else 0
        )
        self._last_output_text_offset = 0
        self.output_text = ""

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        if not new_token_ids:
            return None
        # A stop token (EOS or stop_token_ids) is not part of the text unless asked.
        skipped = None
        if stop_terminated and not self.include_stop_str_in_output:
            skipped, new_token_ids = new_token_ids[-1], new_token_ids[:-1]
        num_prev_tokens = self.num_output_tokens()
        first_new_index = len(self.token_ids)
        # Text length after each new token: lets a stop string cut tokens too.
        offsets = [len(self.output_text)]
        for token_id in new_token_ids:
            self.token_ids.append(token_id)
            self.output_text += self.decode_next(token_id)
            offsets.append(len(self.output_text))
        if skipped is not None:
            self.token_ids.append(skipped)
            offsets.append(len(self.output_text))
        if not self.stop or self.num_output_tokens() <= self.min_tokens:
            return None
        # Only text produced after min_tokens may complete a stop string.
        check_from = offsets[max(self.min_tokens - num_prev_tokens, 0)]
        match = check_stop_strings(
            self.output_text,
            len(self.output_text) - check_from,
            self.stop,
            self.include_stop_str_in_output,
        )
        if match is None:
            return None
        stop_string, truncate_to = match
        stop_end = len(self.output_text) if truncate_to == -1 else truncate_to
        if not self.include_stop_str_in_output:
            stop_end += len(stop_string)
        # Tokens after the one that completed the stop string are dropped
        # (several can arrive in one step, e.g. with speculative decoding).
        num_kept = bisect_left(offsets, stop_end, lo=1)
        del self.token_ids[first_new_index + num_kept :]
        if truncate_to != -1:
            self.output_text = self.output_text[:truncate_to]
        return stop_string

    @abstractmethod
    def decode_next(self, next_token_id: int) -> str:
        """Text that `next_token_id` adds ("" while a character is incomplete)."""

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        hold = 0 if finished else self.stop_buffer_length
        end = len(self.output_text) - hold
        if not delta:
            return self.output_text[:end] if hold else self.output_text
        start = self._last_output_text_offset
        if start >= end:
            return ""
        self._last_output_text_offset = end
        return self.output_text[start:end]


class FastIncrementalDetokenizer(BaseIncrementalDetokenizer):
    """Decodes with the Rust tokenizer's `DecodeStream`, primed with the prompt."""

    def __init__(self, tokenizer: TokenizerLike, request: EngineCoreRequest) -> None:
        super().__init__(request)
        params = request.sampling_params
        assert params is not None  # checked by the base class
        backend = _fast_backend(tokenizer)
        assert backend is not None, "a fast tokenizer (from_new_request checks it)"
        self.request_id = request.request_id
        self.skip_special_tokens = params.skip_special_tokens
        self.tokenizer = backend
        self.stream = self._make_stream(list(request.prompt_token_ids or []))
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        # Without spaces between special tokens, consecutive added tokens are
        # emitted as their raw content (DecodeStream would insert a space).
        self.spaces_between_special_tokens = (
            params.skip_special_tokens or params.spaces_between_special_tokens
        )
        self.added_token_ids: dict[int, str] = {}
        if not self.spaces_between_special_tokens:
            self.added_token_ids = {
                tid: tok.content for tid, tok in self.tokenizer.get_added_tokens_decoder().items()
            }
            self.spaces_between_special_tokens = not self.added_token_ids
        self.last_special = False

    def _make_stream(self, prompt_ids: list[int] | None) -> DecodeStream:
        from tokenizers.decoders import DecodeStream

        return DecodeStream(ids=prompt_ids, skip_special_tokens=self.skip_special_tokens)

    def decode_next(self, next_token_id: int) -> str:
        text = self._protected_step(next_token_id)
        if not self.spaces_between_special_tokens:
            special = self.added_token_ids.get(next_token_id)
            if special is not None and self.last_special:
                text = special
            self.last_special = special is not None
        return text or ""

    def _protected_step(self, next_token_id: int) -> str | None:
        if not 0 <= next_token_id < self.vocab_size:
            # Models may pad their vocabulary past the tokenizer's: such ids
            # (never sampled by a trained model) decode to nothing.
            return None
        try:
            return self.stream.step(self.tokenizer, next_token_id)
        except Exception as e:
            if not str(e).startswith(INVALID_PREFIX_ERR_MSG):
                raise
            # Some tokenizers produce non-monotonic byte output that breaks the
            # stream's state; start a fresh stream from this token.
            logger.warning("Resetting the decode stream of request %s: %s", self.request_id, e)
            self.stream = self._make_stream(None)
            return self.stream.step(self.tokenizer, next_token_id)


class SlowIncrementalDetokenizer(BaseIncrementalDetokenizer):
    """Decodes with prefix/read offsets over Python tokenizers' token strings."""

    def __init__(self, tokenizer: TokenizerLike, request: EngineCoreRequest) -> None:
        super().__init__(request)
        params = request.sampling_params
        assert params is not None  # checked by the base class
        self.tokenizer = tokenizer
        self.skip_special_tokens = params.skip_special_tokens
        self.spaces_between_special_tokens = params.spaces_between_special_tokens
        prompt = list(request.prompt_token_ids or [])
        self.tokens, self.prefix_offset, self.read_offset = convert_prompt_ids_to_tokens(
            tokenizer, prompt, skip_special_tokens=self.skip_special_tokens
        )
        # Prompt ids plus output ids: the decode window needs the left context.
        self.all_ids = prompt

    def decode_next(self, next_token_id: int) -> str:
        self.all_ids.append(next_token_id)
        new_tokens, text, self.prefix_offset, self.read_offset = detokenize_incrementally(
            self.tokenizer,
            self.all_ids,
            self.tokens,
            self.prefix_offset,
            self.read_offset,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
        )
        self.tokens.extend(new_tokens)
        return text


def check_stop_strings(
    output_text: str, new_char_count: int, stop: list[str], include_in_output: bool
) -> tuple[str, int] | None:
    """Find a stop string completed within the last `new_char_count` characters.

    Returns (stop_string, truncate_to) or None. truncate_to is where the text
    must be cut: the stop string's start when it is hidden, its end when it is
    shown (-1 when that is already the end of the text). If several complete
    in the new text, the one that completes first wins (ties: list order), so
    a multi-token step gives what one token at a time would have.
    """
    if not new_char_count or not stop:
        return None
    best: tuple[str, int] | None = None
    best_end = sys.maxsize
    for stop_str in stop:
        # A match must end inside the new text, so it starts no earlier than this.
        start = max(len(output_text) - new_char_count - len(stop_str) + 1, 0)
        index = output_text.find(stop_str, start)
        if index != -1 and index + len(stop_str) < best_end:
            best, best_end = (stop_str, index), index + len(stop_str)
    if best is None:
        return None
    stop_str, index = best
    if not include_in_output:
        return stop_str, index
    return stop_str, -1 if best_end >= len(output_text) else best_end
