"""Bounded work per request, decided before the work is done (no upstream
counterpart; upstream v0.28 reads and tokenizes whatever it is sent).

* `RequestBodyLimitMiddleware`: a body over `--max-request-body-bytes` is a
  413 with the error envelope. A declared Content-Length is checked before a
  byte is read; a chunked body is counted as it streams in and refused as soon
  as it passes the limit, so the app never holds more than the limit.
* `PromptLengthBound`: a lower bound on the number of tokens of a text, from
  its UTF-8 length alone, for the tokenizers where one can be proved (see
  `PromptLengthBound.from_tokenizer`). A prompt whose bound already exceeds
  the context is refused without tokenizing it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vllm.entrypoints.openai.protocol import ErrorInfo, ErrorResponse
from vllm.entrypoints.utils import Utf8JSONResponse
from vllm.exceptions import VLLMValidationError
from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.tokenizers import TokenizerLike

logger = init_logger(__name__)

# Default body limit: max(floor, bytes per token x max_model_len). 128 bytes a
# token covers a full-context prompt as JSON even when every token is a long
# piece written with \uXXXX escapes (12 bytes per 4-byte character), with room
# for a few such prompts; the floor keeps chat requests with large tool lists
# or schemas on short-context models working.
DEFAULT_BODY_BYTES_PER_TOKEN = 128
MIN_DEFAULT_BODY_BYTES = 16 * 2**20


def default_max_request_body_bytes(max_model_len: int) -> int:
    """The body limit when `--max-request-body-bytes` is not given."""
    return max(MIN_DEFAULT_BODY_BYTES, DEFAULT_BODY_BYTES_PER_TOKEN * max_model_len)


def body_too_large_message(limit: int) -> str:
    return (
        f"The request body is larger than this server accepts ({limit} bytes; "
        "see --max-request-body-bytes)."
    )


class RequestBodyLimitMiddleware:
    """413 for a request body over the limit (pure ASGI).

    The limit is read from `app.state.max_request_body_bytes` (set by
    `init_app_state` from the flag or the model's context length). A request
    whose Content-Length is over it is answered here without reading the body
    (uvicorn discards what the client still sends). Otherwise the receive
    channel is wrapped: once more bytes than the limit have arrived it raises
    an HTTPException(413), which FastAPI lets through its body parsing to the
    app's handler, so the answer is the same envelope.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        app = scope.get("app")
        limit = getattr(getattr(app, "state", None), "max_request_body_bytes", None)
        if limit is None:
            return await self.app(scope, receive, send)
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await self._refuse(scope, receive, send, limit)
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise HTTPException(413, body_too_large_message(limit))
            return message

        await self.app(scope, limited_receive, send)

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        body = ErrorResponse(
            error=ErrorInfo(
                message=body_too_large_message(limit),
                type="Request Entity Too Large",
                param=None,
                code=413,
            )
        )
        response = Utf8JSONResponse(body.model_dump(), status_code=413)
        await response(scope, receive, send)


# ----------------------------------------------------------------------
# A lower bound on a text's token count
# ----------------------------------------------------------------------

# Longest canonical decomposition of one character, in code points (U+1F82
# and its kin: a Greek vowel with three marks); checked against the Unicode
# tables by tests/entrypoints/openai/test_request_limits.py.
MAX_CANONICAL_DECOMPOSITION = 4

# Worst-case shrink (input UTF-8 bytes / output UTF-8 bytes) of each
# normalizer that never deletes text. A map of each character to a non-empty
# string shrinks by at most 4 (a character is at most 4 bytes, its image at
# least 1): Lowercase, NFD, NFKD. Composition (NFC, NFKC) merges the
# characters of one canonical decomposition, at most K = 4 input characters
# of at most 4 bytes each, into one composite of at least 2 bytes (every
# composite is U+00C0 or above): at most 4K / 2 = 8. Prepend only adds; a
# ByteLevel normalizer maps each byte to one character of 1 or 2 bytes.
_SHRINK = {
    "Lowercase": 4,
    "NFD": 4,
    "NFKD": 4,
    "NFC": 2 * MAX_CANONICAL_DECOMPOSITION,
    "NFKC": 2 * MAX_CANONICAL_DECOMPOSITION,
    "Prepend": 1,
    "ByteLevel": 1,
}
# Pre-tokenizers that only split the text or map it to longer text (ByteLevel:
# each byte becomes one character; Metaspace: " " becomes the 3-byte "▁").
# Any of them with the "Removed" behaviour drops the delimiters: refused.
_SPLITTING_PRE_TOKENIZERS = {
    "ByteLevel",
    "Metaspace",
    "Split",
    "Digits",
    "Punctuation",
    "UnicodeScripts",
}


@dataclass(frozen=True)
class PromptLengthBound:
    """`min_tokens(text) = ceil((utf8 bytes - dropped) / bytes_per_token)`,
    where `dropped` counts the characters of `dropped_chars` (ASCII ones the
    vocabulary has no token for: the model drops them or maps a run of them
    to one unknown token); 0 where no bound is proved (`bytes_per_token` None)."""

    bytes_per_token: int | None
    dropped_chars: str = ""
    reason: str = ""

    def min_tokens(self, text: str) -> int:
        if self.bytes_per_token is None:
            return 0
        dropped = sum(text.count(ch) for ch in self.dropped_chars)
        return math.ceil((_utf8_len(text) - dropped) / self.bytes_per_token)

    @staticmethod
    def from_tokenizer(tokenizer: TokenizerLike) -> PromptLengthBound:
        """Prove a bound for a Hugging Face fast tokenizer, or give none.

        Proof. Encoding runs: split out added tokens -> normalizer ->
        pre-tokenizer -> model -> post-processor. Let T be the text's bytes.
        (1) An added-token match is one token covering exactly its content
        (refused below if it may absorb neighbouring whitespace: lstrip/rstrip).
        (2) The normalizer turns a segment of b bytes into at least b / s bytes
        (s from _SHRINK, multiplied over a Sequence; anything that may delete
        text has no s and no bound). (3) The allowed pre-tokenizers only split
        or lengthen. (4) A BPE or Unigram token covers exactly its vocabulary
        string (merges concatenate), or one byte for a byte-fallback token
        "<0xNN>" (6 bytes long), as long as every input character has a token:
        all 256 byte-fallback tokens are in the vocabulary, or (ByteLevel) the
        characters of all bytes valid UTF-8 can hold. Byte-level vocabularies
        often lack a few: an ASCII control byte without a token is dropped (or
        a run of them is one unknown token) - those characters are counted out
        of T, which is sound only without a normalizer that could make them;
        a UTF-8 lead byte without a token drops one byte of a character of at
        least 2 whose continuation bytes all have tokens - doubling M covers it.
        So each token covers at most s * M bytes of what is left of the input,
        M the most bytes a vocabulary piece (a byte-level piece: one byte per
        character) or an added token (its UTF-8 length) stands for, and the
        post-processor only adds tokens: tokens >= (T - dropped) / (s * M).
        """
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            return PromptLengthBound(None, reason="not a fast (Rust) tokenizer")
        spec = json.loads(backend.to_str())
        norm = spec.get("normalizer")
        shrink, why = _normalizer_shrink(norm)
        if shrink is None:
            return PromptLengthBound(None, reason=why)
        pre = spec.get("pre_tokenizer")
        why = _pre_tokenizer_problem(pre)
        if why:
            return PromptLengthBound(None, reason=why)
        coverage = _token_coverage(spec, _uses_byte_level(pre))
        if isinstance(coverage, str):
            return PromptLengthBound(None, reason=coverage)
        longest, dropped = coverage
        if dropped and norm is not None:
            return PromptLengthBound(None, reason="characters without a token, and a normalizer")
        return PromptLengthBound(shrink * longest, dropped)


def _utf8_len(text: str) -> int:
    if text.isascii():  # no copy for the common case
        return len(text)
    return len(text.encode("utf-8", errors="surrogatepass"))


def _normalizer_shrink(norm: dict | None) -> tuple[int | None, str]:
    if norm is None:
        return 1, ""
    kind = norm.get("type")
    if kind == "Sequence":
        total = 1
        for part in norm.get("normalizers", []):
            shrink, why = _normalizer_shrink(part)
            if shrink is None:
                return None, why
            total *= shrink
        return total, ""
    if kind == "Replace":
        pattern, content = norm.get("pattern", {}), norm.get("content", "")
        if "String" not in pattern or not content:
            return None, "a Replace normalizer with a regex or an empty replacement"
        return max(1, math.ceil(len(pattern["String"].encode()) / len(content.encode()))), ""
    if kind in _SHRINK:
        return _SHRINK[kind], ""
    return None, f"the {kind} normalizer may delete text"


def _pre_tokenizer_problem(pre: dict | None) -> str:
    if pre is None:
        return ""
    kind = pre.get("type")
    if kind == "Sequence":
        return next((p for p in map(_pre_tokenizer_problem, pre.get("pretokenizers", [])) if p), "")
    if kind not in _SPLITTING_PRE_TOKENIZERS:
        return f"the {kind} pre-tokenizer may drop text"
    if pre.get("behavior") == "Removed":
        return f"the {kind} pre-tokenizer removes its delimiters"
    return ""


def _uses_byte_level(pre: dict | None) -> bool:
    if pre is None:
        return False
    if pre.get("type") == "Sequence":
        return any(_uses_byte_level(p) for p in pre.get("pretokenizers", []))
    return pre.get("type") == "ByteLevel"


def _byte_level_chars() -> dict[int, str]:
    """GPT-2's ByteLevel alphabet: printable Latin-1 bytes stand for
    themselves, the other 68 bytes for U+0100 onwards, in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(0x100 + i) for i, b in enumerate(others)}}


def _token_coverage(spec: dict, byte_level: bool) -> tuple[int, str] | str:
    """(M, ASCII characters without a token) as in from_tokenizer step (4);
    M doubled where a UTF-8 lead byte has no token. A str: why no bound."""
    model = spec.get("model") or {}
    kind = model.get("type")
    if kind == "BPE":
        pieces = list(model.get("vocab", {}))
    elif kind == "Unigram":
        pieces = [entry[0] for entry in model.get("vocab", [])]
    else:
        return f"a {kind} model (unknown tokens may cover many characters)"
    vocab = set(pieces)
    dropped, factor = "", 1
    if byte_level:
        missing = [b for b, ch in _byte_level_chars().items() if ch not in vocab]
        # 0xC0, 0xC1 and 0xF5-0xFF never occur in UTF-8.
        missing = [b for b in missing if b not in (0xC0, 0xC1) and b < 0xF5]
        if any(0x80 <= b <= 0xBF for b in missing):
            return "a UTF-8 continuation byte has no token"
        dropped = "".join(chr(b) for b in missing if b < 0x80)
        factor = 2 if any(b >= 0xC2 for b in missing) else 1
    elif not (model.get("byte_fallback") and all(f"<0x{b:02X}>" in vocab for b in range(256))):
        return "some characters may map to an unknown token"
    added = spec.get("added_tokens") or []
    if any(t.get("lstrip") or t.get("rstrip") for t in added):
        return "an added token absorbs neighbouring whitespace (lstrip/rstrip)"
    # A byte-level piece covers one input byte per character (its UTF-8 form
    # is up to twice as long); added tokens match raw text, their UTF-8 bytes.
    alphabet = set(_byte_level_chars().values()) if byte_level else set()
    longest = max(
        (len(p) if byte_level and set(p) <= alphabet else len(p.encode("utf-8")) for p in pieces),
        default=1,
    )
    longest = max([longest, *(len(t.get("content", "").encode("utf-8")) for t in added)])
    return factor * longest, dropped


# One bound per tokenizer (a server has one), computed at start-up by
# init_app_state: parsing a large vocabulary takes a fraction of a second.
_BOUNDS: dict[int, tuple[TokenizerLike, PromptLengthBound]] = {}


def prompt_length_bound(tokenizer: TokenizerLike) -> PromptLengthBound:
    """The tokenizer's bound (cached)."""
    entry = _BOUNDS.get(id(tokenizer))
    if entry is None or entry[0] is not tokenizer:
        bound = PromptLengthBound.from_tokenizer(tokenizer)
        if bound.bytes_per_token is None:
            logger.info("Prompt lengths are checked after tokenizing only: %s.", bound.reason)
        else:
            logger.info(
                "A prompt text has at least one token per %d bytes: longer ones "
                "than the context are refused before tokenizing.",
                bound.bytes_per_token,
            )
        entry = _BOUNDS[id(tokenizer)] = (tokenizer, bound)
    return entry[1]


def check_prompt_text_length(
    tokenizer: TokenizerLike,
    text: str,
    max_model_len: int,
    max_tokens: int | None,
    param: str = "prompt",
) -> None:
    """Refuse a text provably too long for the context, before tokenizing it,
    with upstream's messages for a prompt of (at least) that many tokens.

    The prompt needs `max_tokens` more positions (at least one when not given,
    as the exact check after tokenizing). Only `min_tokens(text)` is known
    here, so a text that passes may still be refused once tokenized."""
    min_tokens = prompt_length_bound(tokenizer).min_tokens(text)
    room = max_model_len - (1 if max_tokens is None else max_tokens)
    if min_tokens <= room:
        return
    if not max_tokens:  # None, or 0 on /tokenize (the prompt alone)
        raise VLLMValidationError(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"request has at least {min_tokens} input tokens ({_utf8_len(text)} bytes of "
            "text). Please reduce the length of the input messages.",
            parameter=param,
        )
    raise VLLMValidationError(
        f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
        f"maximum context length is {max_model_len} tokens and your request has at least "
        f"{min_tokens} input tokens ({max_tokens} > {max_model_len} - {min_tokens}).",
        parameter="max_tokens",
    )


def check_token_count(num_tokens: int, max_model_len: int, param: str) -> None:
    """A token list longer than the context (e.g. on /detokenize) is refused."""
    if num_tokens > max_model_len:
        raise VLLMValidationError(
            f"This model's maximum context length is {max_model_len} tokens. However, "
            f"your request has {num_tokens} tokens.",
            parameter=param,
        )
